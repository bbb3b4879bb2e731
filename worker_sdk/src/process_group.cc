#include "crun/worker/process_group.h"

#include "worker_sdk/src/group_state.h"

namespace crun::worker {

std::size_t SizeOf(DType t) {
  switch (t) {
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kFloat64:
    case DType::kInt64:
      return 8;
  }
  return 0;
}

const char* Name(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
  }
  return "?";
}

const char* Name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
  }
  return "?";
}

}  // namespace crun::worker

namespace crun::worker {
namespace {

class Finished final : public Work {
 public:
  explicit Finished(Status s) : status_(std::move(s)) {}
  bool Test() override { return true; }
  Status Wait() override { return status_; }

 private:
  Status status_;
};

}  // namespace

WorkPtr FinishedWork(Status status) { return std::make_shared<Finished>(std::move(status)); }

}  // namespace crun::worker

namespace crun::worker {

std::string DescribeReduce(const char* op_name, std::size_t count, DType dtype, ReduceOp op) {
  return std::string(op_name) + " of " + std::to_string(count) + " " + Name(dtype) + " (" +
         Name(op) + ")";
}

std::string DescribeMove(const char* op_name, std::size_t count, DType dtype) {
  return std::string(op_name) + " of " + std::to_string(count) + " " + Name(dtype);
}

}  // namespace crun::worker
