/* elem.c - the training step's passes over rows that are not products: the
 * residual add, ReLU and its mask, a block of rows' column sums. Plain
 * loops, kept in a kernel file so that they run at the machine's vector
 * width: the model's own code is compiled once, for the baseline (SSE2). */
#include "nn.h"

void aft_vadd(float *restrict out, const float *restrict x, const float *restrict y, size_t n)
{
    for (size_t i = 0; i < n; i++) out[i] = x[i] + y[i];
}

void aft_relu(float *h, size_t n)
{
    /* a NaN compares false and stays, as torch.relu keeps it */
    for (size_t i = 0; i < n; i++) h[i] = h[i] <= 0.0f ? 0.0f : h[i];
}

void aft_relu_back(float *restrict dh, const float *restrict h, size_t n)
{
    for (size_t i = 0; i < n; i++) dh[i] = h[i] > 0.0f ? dh[i] : 0.0f;
}

void aft_col_sums(float *restrict s, const float *restrict a, size_t rows, size_t n)
{
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < n; j++) s[j] += a[i * n + j];
}
