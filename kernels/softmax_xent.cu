// softmax_cross_entropy (softmax_xent.cuh says what it computes): the classification head of
// a training step, over logits another kernel wrote. (matmul_softmax_cross_entropy, matmul.cu,
// computes the logits too, in the same launch.)
//
// Launch: grid 1, block REDUCE_THREADS. One block: a training batch's rows are few (a hundred
// rows of ten classes is a thousand values), and a second kernel for the mean would cost more
// than the rows' arithmetic.

#include "softmax_xent.cuh"

extern "C" __global__ void softmax_cross_entropy(const float *__restrict__ logits,
                                                 const unsigned *__restrict__ labels,
                                                 float *__restrict__ dlogits, unsigned rows,
                                                 unsigned classes, float *__restrict__ loss,
                                                 const unsigned *__restrict__ loss_at,
                                                 unsigned *__restrict__ status,
                                                 const float *__restrict__ loss_scale,
                                                 int narrow) {
    const float inv_rows = 1.0f / rows;
    const float s = loss_scale ? loss_scale[0] : 1.0f;
    double total = 0.0; // this thread's rows' losses, in row order
    for (unsigned r = threadIdx.x; r < rows; r += REDUCE_THREADS) {
        const size_t at = (size_t)r * classes;
        total += softmax_cross_entropy_row(logits + at, labels[r], dlogits + at, classes,
                                           inv_rows, s, narrow);
    }
    softmax_cross_entropy_mean(total, labels, rows, classes, loss, loss_at, status);
}
