// Elementwise reductions of raw buffers, per dtype: what every CPU collective folds blocks
// with. 16-bit floats are reduced in float32 and rounded back.
#pragma once

#include <cstddef>
#include <functional>

#include "crun/worker/process_group.h"

namespace crun::worker {

// out[i] = op(a[i], b[i]) for n elements; `out` may be `a` or `b`.
using ReduceFn = std::function<void(void* out, const void* a, const void* b, std::size_t n)>;

// kAvg reduces as a sum: the caller scales the result by 1/size with Scale().
ReduceFn ReduceFunc(DType t, ReduceOp op);

// data[i] *= factor for floating dtypes; integers are left alone (avg on them is refused
// before any operation starts).
void Scale(void* data, std::size_t count, DType t, double factor);

}  // namespace crun::worker
