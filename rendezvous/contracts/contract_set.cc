#include "rendezvous/contracts/contract_set.h"

#include <algorithm>
#include <iterator>
#include <sstream>
#include <string_view>

#include "base/spelling.h"

namespace crun {
namespace {

struct Named {
  const char* name;
  Contract contract;
};
// In the order ToString writes them; "tf" is TensorFlow's usual short name.
constexpr Named kNames[] = {{"torch", Contract::kTorch},
                            {"tensorflow", Contract::kTensorflow},
                            {"jax", Contract::kJax},
                            {"horovod", Contract::kHorovod},
                            {"deepspeed", Contract::kDeepspeed},
                            {"mpi", Contract::kMpi},
                            {"tf", Contract::kTensorflow}};

}  // namespace

std::string ContractSet::ToString() const {
  std::string out;
  for (const auto& [name, c] : kNames) {
    if (std::string_view(name) == "tf" || !Has(c)) continue;
    out += (out.empty() ? "" : ",") + std::string(name);
  }
  if (!Known()) out += ",unknown contracts (bits " + std::to_string(bits_ & ~kAllBits) + ")";
  return out;
}

ContractSet ContractSet::FromBits(std::uint32_t bits) {
  ContractSet set;
  set.bits_ |= bits;
  return set;
}

const std::vector<std::string>& ContractNames() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& n : kNames) v.emplace_back(n.name);
    return v;
  }();
  return names;
}

StatusOr<ContractSet> ParseContracts(const std::string& list) {
  ContractSet set;
  std::stringstream in(list);
  std::string word;
  bool any = false;
  while (std::getline(in, word, ',')) {
    any = true;
    const auto* found = std::find_if(std::begin(kNames), std::end(kNames),
                                     [&](const Named& n) { return word == n.name; });
    if (found != std::end(kNames)) {
      set.Add(found->contract);
      continue;
    }
    std::string message = "unknown contract '" + word + "'";
    if (const std::string best = ClosestName(word, ContractNames()); !best.empty()) {
      message += " (did you mean " + best + "?)";
    }
    return InvalidArgument(message +
                           "; known: torch, tensorflow (tf), jax, horovod, deepspeed, mpi");
  }
  if (!any || list.back() == ',') {
    return InvalidArgument("--contract '" + list +
                           "' names no contract: give a comma-separated list such as "
                           "'tensorflow' or 'jax,mpi'");
  }
  return set;
}

PortLayout::PortLayout(const ContractSet& contracts, int nproc)
    : contracts_(contracts), nproc_(std::max(nproc, 0)) {
  std::size_t next = 0;
  if (contracts.Has(Contract::kTensorflow)) {
    worker_ports_ = nproc_;
    next = static_cast<std::size_t>(nproc_);
  }
  if (contracts.Has(Contract::kJax)) jax_ = next++;
  if (contracts.Has(Contract::kHorovod)) horovod_ = next++;
  count_ = static_cast<int>(next);
}

std::optional<std::size_t> PortLayout::Worker(int local_rank) const {
  if (local_rank < 0 || local_rank >= worker_ports_) return std::nullopt;
  return static_cast<std::size_t>(local_rank);
}

Status PortLayout::Check(std::size_t reserved) const {
  if (reserved == static_cast<std::size_t>(count_)) return Status::Ok();
  return InvalidArgument(std::to_string(reserved) + " reserved ports for " +
                         std::to_string(nproc_) + (nproc_ == 1 ? " worker" : " workers") +
                         " where --contract " + contracts_.ToString() + " needs " +
                         std::to_string(count_));
}

}  // namespace crun
