/* What tests/nccl/fake_cuda.c offers besides the CUDA API it imitates. */
#ifndef DSHIM_FAKE_CUDA_H
#define DSHIM_FAKE_CUDA_H

#include <stdint.h>

/* The calling thread may call CUDA (the test's own threads). */
void fake_cuda_allow_thread(void);
/* Calls so far from threads neither allowed nor a stream's. */
int fake_cuda_foreign_calls(void);
/* For the fake driver: a wait for (write of) a 32-bit value, in stream order. */
int fake_cuda_push_value(void *stream, volatile uint32_t *addr, uint32_t value, int write);

#endif
