#include "worker_sdk/src/reduce.h"

#include <cstdint>

#include "worker_sdk/src/half.h"

namespace crun::worker {
namespace {

template <typename T, typename Op>
void Combine(void* c, const void* a, const void* b, std::size_t n, Op op) {
  auto* out = static_cast<T*>(c);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  for (std::size_t i = 0; i < n; ++i) out[i] = op(x[i], y[i]);
}

// 16-bit floats are reduced in float32 and rounded back.
template <float (*ToFloat)(std::uint16_t), std::uint16_t (*FromFloat)(float), typename Op>
void Combine16(void* c, const void* a, const void* b, std::size_t n, Op op) {
  auto* out = static_cast<std::uint16_t*>(c);
  const auto* x = static_cast<const std::uint16_t*>(a);
  const auto* y = static_cast<const std::uint16_t*>(b);
  for (std::size_t i = 0; i < n; ++i) out[i] = FromFloat(op(ToFloat(x[i]), ToFloat(y[i])));
}

struct Sum {
  template <typename T>
  T operator()(T a, T b) const {
    return a + b;
  }
};
struct Min {
  template <typename T>
  T operator()(T a, T b) const {
    return b < a ? b : a;
  }
};
struct Max {
  template <typename T>
  T operator()(T a, T b) const {
    return a < b ? b : a;
  }
};

template <typename Op>
ReduceFn FuncFor(DType t, Op op) {
  switch (t) {
    case DType::kFloat32:
      return [op](void* c, const void* a, const void* b, std::size_t n) {
        Combine<float>(c, a, b, n, op);
      };
    case DType::kFloat64:
      return [op](void* c, const void* a, const void* b, std::size_t n) {
        Combine<double>(c, a, b, n, op);
      };
    case DType::kInt32:
      return [op](void* c, const void* a, const void* b, std::size_t n) {
        Combine<std::int32_t>(c, a, b, n, op);
      };
    case DType::kInt64:
      return [op](void* c, const void* a, const void* b, std::size_t n) {
        Combine<std::int64_t>(c, a, b, n, op);
      };
    case DType::kFloat16:
      return [op](void* c, const void* a, const void* b, std::size_t n) {
        Combine16<HalfToFloat, FloatToHalf>(c, a, b, n, op);
      };
    case DType::kBFloat16:
      return [op](void* c, const void* a, const void* b, std::size_t n) {
        Combine16<BFloat16ToFloat, FloatToBFloat16>(c, a, b, n, op);
      };
  }
  return {};
}

}  // namespace

void Scale(void* data, std::size_t count, DType t, double factor) {
  switch (t) {
    case DType::kFloat32: {
      auto* p = static_cast<float*>(data);
      for (std::size_t i = 0; i < count; ++i) p[i] = static_cast<float>(p[i] * factor);
      break;
    }
    case DType::kFloat64: {
      auto* p = static_cast<double*>(data);
      for (std::size_t i = 0; i < count; ++i) p[i] *= factor;
      break;
    }
    case DType::kFloat16: {
      auto* p = static_cast<std::uint16_t*>(data);
      for (std::size_t i = 0; i < count; ++i) {
        p[i] = FloatToHalf(static_cast<float>(HalfToFloat(p[i]) * factor));
      }
      break;
    }
    case DType::kBFloat16: {
      auto* p = static_cast<std::uint16_t*>(data);
      for (std::size_t i = 0; i < count; ++i) {
        p[i] = FloatToBFloat16(static_cast<float>(BFloat16ToFloat(p[i]) * factor));
      }
      break;
    }
    case DType::kInt32:
    case DType::kInt64:
      break;  // refused before the operation
  }
}

ReduceFn ReduceFunc(DType t, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return FuncFor(t, Sum{});
    case ReduceOp::kMin:
      return FuncFor(t, Min{});
    case ReduceOp::kMax:
      return FuncFor(t, Max{});
  }
  return {};
}

}  // namespace crun::worker
