/* MXNet's 2-bit gradient compression (kv.set_gradient_compression({'type': '2bit', ...})),
 * bit-exact with MXNet 1.9.1 (src/kvstore/gradient_compression{.cc,-inl.h}).
 *
 * Format: every 16 floats become one 32-bit word (MXNet stores it in a float array of
 * ceil(n/16) elements; the words here hold the same bytes).  Value k of a block sits in
 * byte k/4 of the word's memory, most significant bit pair first: bits 11 = +threshold,
 * 10 = -threshold, 00 (and 01, never emitted) = 0.  Unused pairs of a last partial block
 * are 0.
 *
 * Quantize keeps a residual per value (error feedback): residual += grad; a residual
 * >= threshold emits +threshold and loses it, else one <= -threshold emits -threshold
 * and gains it; anything else (NaN included) emits 0 and stays.
 *
 * Threshold on the server side of a 'dist' kvstore: MXNet's worker sends it as
 * std::to_string(float) ("%f", 6 decimals) and the server dequantizes with stof() of
 * that text, so it can differ from the worker's (1e-7 becomes 0):
 * dshim_twobit_server_threshold() gives that value. */
#ifndef DSHIM_PS_TWOBIT_H
#define DSHIM_PS_TWOBIT_H

#include <stddef.h>
#include <stdint.h>

/* MXNet's threshold when the parameters do not name one. */
#define DSHIM_TWOBIT_DEFAULT_THRESHOLD 0.5f
/* Room for dshim_twobit_encode_params' text (the largest float in "%f" is 46 chars). */
#define DSHIM_TWOBIT_PARAMS_MAX 64

/* Number of 32-bit words holding the compressed form of n floats: ceil(n / 16). */
size_t dshim_twobit_words(size_t n);

/* MXNet's quantize_2bit over n values: updates residual[0..n) and writes
 * out[0..dshim_twobit_words(n)).  The three arrays must not overlap. */
void dshim_twobit_quantize(const float *grad, float *residual, size_t n, float threshold,
                           uint32_t *out);

/* MXNet's dequantize_2bit: out[i] = +threshold, -threshold or +0.0f for i < n. */
void dshim_twobit_dequantize(const uint32_t *in, size_t n, float threshold, float *out);

/* Validates the key/value strings of MXKVStoreSetGradientCompression the way MXNet's
 * GradientCompression::SetParams does: `type` required and must be "2bit" (MXNet 1.9.1
 * knows no other, "none" included); `threshold` optional (default 0.5), parsed like
 * dmlc::stof (so the value is the one MXNet's worker uses), must be > 0; other keys are
 * ignored, a repeated key counts last.  On success *threshold and *enabled (always 1)
 * are set; otherwise DSHIM_ERR_INVALID with a one-line dshim_error message. */
int dshim_twobit_parse(uint32_t num, const char *const *keys, const char *const *vals,
                       float *threshold, int *enabled);

/* GradientCompression::EncodeParams: the body of MXNet's kSetGradientCompression command,
 * "1,<threshold as %f>" when enabled, "0" when not.  Returns the length, or
 * DSHIM_ERR_INVALID when cap is too small. */
int dshim_twobit_encode_params(int enabled, float threshold, char *buf, size_t cap);

/* GradientCompression::DecodeParams: "<type>[,<threshold>]" as a server receives it.
 * Sets *enabled (type 0 = off, 1 = 2bit); *threshold only when the text has one (MXNet
 * keeps the previous value otherwise).  DSHIM_ERR_INVALID where MXNet's stoi/stof
 * would throw, or for a type other than 0 and 1. */
int dshim_twobit_decode_params(const char *body, float *threshold, int *enabled);

/* The threshold a MXNet 'dist' server dequantizes with when the worker's is `t`:
 * stof(to_string(t)). */
float dshim_twobit_server_threshold(float t);

#endif
