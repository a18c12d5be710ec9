// Token + position embedding on the CPU.
#ifndef LLMC_CPU_ENCODER_H
#define LLMC_CPU_ENCODER_H

// out (B, T, C) = wte[inp[b, t]] (Vp, C) + wpe[t] (maxT, C)
static inline void encoder_forward(float* out, const int* inp, const float* wte, const float* wpe, int B,
                            int T, int C) {
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            float* o = out + ((size_t)b * T + t) * C;
            const float* tok = wte + (size_t)inp[b * T + t] * C;
            const float* pos = wpe + (size_t)t * C;
            for (int c = 0; c < C; c++) o[c] = tok[c] + pos[c];
        }
    }
}

// dwte (Vp, C) and dwpe (maxT, C) += dout (B, T, C) scattered by token and position. Threads
// split the channels, so rows hit by repeated tokens are summed in one fixed order.
static inline void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* inp, int B,
                             int T, int C) {
    #pragma omp parallel for
    for (int c = 0; c < C; c++) {
        for (int b = 0; b < B; b++) {
            for (int t = 0; t < T; t++) {
                float d = dout[((size_t)b * T + t) * C + c];
                dwte[(size_t)inp[b * T + t] * C + c] += d;
                dwpe[(size_t)t * C + c] += d;
            }
        }
    }
}

#endif
