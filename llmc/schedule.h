// Learning rate: linear warmup to lr_max over `warmup` steps, then cosine decay to
// lr_max * final_fraction at the last step (GPT-3 paper, appendix B; llm.c's default schedule).
#ifndef LLMC_SCHEDULE_H
#define LLMC_SCHEDULE_H

#include <math.h>

static inline float learning_rate_at(int step, float lr_max, int warmup, int max_steps,
                              float final_fraction) {
    if (step < warmup) return lr_max * (float)(step + 1) / (float)warmup;
    if (max_steps <= warmup) return lr_max;
    float progress = (float)(step - warmup) / (float)(max_steps - warmup);
    float cosine = 0.5f * (1.0f + cosf(3.14159265358979f * progress));  // 1 -> 0
    float lr_min = lr_max * final_fraction;
    return lr_min + (lr_max - lr_min) * cosine;
}

#endif
