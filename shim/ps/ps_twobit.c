/* The 2-bit codec itself (ps_twobit.h): MXNet 1.9.1's quantize_2bit / dequantize_2bit.
 *
 * Full blocks go through fixed 16-iteration loops with no branches and constant
 * per-position bit masks, so the compiler turns them into vector compares, ands and
 * ors; the arithmetic per value is the one MXNet does (one float add, then one float
 * subtract of the emitted value), so the results are bit-identical whatever the
 * vector width.  This file depends on nothing else in dshim (the MXNet comparison test
 * compiles it alone). */
#include "ps_twobit.h"

#include <string.h>

/* Bit position of value k's pair inside a block word: byte k/4 of the word's memory,
 * the first value of a byte in its two top bits (MXNet's masks 0xc0, 0x30, 0x0c, 0x03). */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define TWOBIT_SHIFT(k) (8u * (3u - ((unsigned)(k) >> 2)) + 6u - 2u * ((unsigned)(k) & 3u))
#else
#define TWOBIT_SHIFT(k) (8u * ((unsigned)(k) >> 2) + 6u - 2u * ((unsigned)(k) & 3u))
#endif
#define POS(k) (3u << TWOBIT_SHIFT(k))
#define NEG(k) (2u << TWOBIT_SHIFT(k))

static const uint32_t pos_mask[16] = {
    POS(0), POS(1), POS(2),  POS(3),  POS(4),  POS(5),  POS(6),  POS(7),
    POS(8), POS(9), POS(10), POS(11), POS(12), POS(13), POS(14), POS(15),
};
static const uint32_t neg_mask[16] = {
    NEG(0), NEG(1), NEG(2),  NEG(3),  NEG(4),  NEG(5),  NEG(6),  NEG(7),
    NEG(8), NEG(9), NEG(10), NEG(11), NEG(12), NEG(13), NEG(14), NEG(15),
};

size_t dshim_twobit_words(size_t n)
{
    return n / 16 + (n % 16 != 0);
}

/* One value, as MXNet's loop body: the code bits it sets in the block word.  The
 * residual always gets `v - emitted`; with emitted = +0.0f that is v itself bit for
 * bit (-0.0f and NaN included).  Both compares always run and the emitted value is
 * chosen with integer masks on its bits: a float select would be control flow that
 * GCC (with its default -ftrapping-math) does not vectorise. */
static inline uint32_t quantize_one(const float *grad, float *residual, unsigned k, float pos,
                                    float neg, uint32_t pos_bits, uint32_t neg_bits)
{
    float v = residual[k] + grad[k];
    uint32_t is_pos = 0u - (uint32_t)(v >= pos);
    uint32_t is_neg = (0u - (uint32_t)(v <= neg)) & ~is_pos;
    uint32_t emitted_bits = (is_pos & pos_bits) | (is_neg & neg_bits);
    float emitted;
    memcpy(&emitted, &emitted_bits, sizeof emitted);
    residual[k] = v - emitted;
    return (is_pos & pos_mask[k]) | (is_neg & neg_mask[k]);
}

static inline uint32_t quantize_block16(const float *restrict grad, float *restrict residual,
                                        float pos, float neg, uint32_t pos_bits,
                                        uint32_t neg_bits)
{
    uint32_t word = 0;
    for (unsigned k = 0; k < 16; k++) {
        word |= quantize_one(grad, residual, k, pos, neg, pos_bits, neg_bits);
    }
    return word;
}

/* restrict (the header says the arrays may not overlap) lets -O2's cheap vectoriser take
 * the 16-value loop without aliasing checks */
void dshim_twobit_quantize(const float *restrict grad, float *restrict residual, size_t n,
                           float threshold, uint32_t *restrict out)
{
    /* MXNet passes threshold and -1 * threshold */
    const float pos = threshold;
    const float neg = -1.0f * threshold;
    uint32_t pos_bits, neg_bits;
    memcpy(&pos_bits, &pos, sizeof pos_bits);
    memcpy(&neg_bits, &neg, sizeof neg_bits);
    size_t full = n / 16;
    for (size_t b = 0; b < full; b++) {
        out[b] = quantize_block16(grad + 16 * b, residual + 16 * b, pos, neg, pos_bits, neg_bits);
    }
    size_t rest = n % 16;
    if (rest != 0) {
        /* MXNet's loop stops at n: no padding values, whose 0 would code as
         * +threshold for a threshold <= 0 */
        uint32_t word = 0;
        for (unsigned k = 0; k < rest; k++) {
            word |= quantize_one(grad + 16 * full, residual + 16 * full, k, pos, neg, pos_bits,
                                 neg_bits);
        }
        out[full] = word;
    }
}

/* MXNet: (byte & posmask) == posmask -> +threshold, == negmask -> -threshold, else +0.0f.
 * Chosen with integer masks on the float bits, for the vectoriser (see quantize_one). */
static inline float dequantize_one(uint32_t word, unsigned k, uint32_t pos_bits,
                                   uint32_t neg_bits)
{
    uint32_t bits = word & pos_mask[k];
    uint32_t is_pos = 0u - (uint32_t)(bits == pos_mask[k]);
    uint32_t is_neg = 0u - (uint32_t)(bits == neg_mask[k]);
    uint32_t out_bits = (is_pos & pos_bits) | (is_neg & neg_bits);
    float out;
    memcpy(&out, &out_bits, sizeof out);
    return out;
}

void dshim_twobit_dequantize(const uint32_t *restrict in, size_t n, float threshold,
                             float *restrict out)
{
    const float pos = threshold;
    const float neg = -1.0f * threshold;
    uint32_t pos_bits, neg_bits;
    memcpy(&pos_bits, &pos, sizeof pos_bits);
    memcpy(&neg_bits, &neg, sizeof neg_bits);
    size_t full = n / 16;
    for (size_t b = 0; b < full; b++) {
        uint32_t word = in[b];
        float *o = out + 16 * b;
        for (unsigned k = 0; k < 16; k++) {
            o[k] = dequantize_one(word, k, pos_bits, neg_bits);
        }
    }
    size_t rest = n % 16;
    for (unsigned k = 0; k < rest; k++) {
        out[16 * full + k] = dequantize_one(in[full], k, pos_bits, neg_bits);
    }
}
