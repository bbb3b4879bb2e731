#include "rendezvous/contracts/contract_set.h"

#include <algorithm>
#include <sstream>

#include "base/spelling.h"

namespace crun {

std::vector<ContractSpec> CrunContracts();  // contracts.cc: crun's own, in Contract's order

namespace {

std::vector<ContractSpec>& Table() {
  static std::vector<ContractSpec> table = CrunContracts();
  return table;
}

std::uint32_t AllBits() {
  const std::size_t n = Table().size();
  return n >= 32 ? ~0u : (1u << n) - 1;
}

std::string Join(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : ", ") + w;
  return out;
}

}  // namespace

const std::vector<ContractSpec>& ContractSpecs() { return Table(); }

const ContractSpec& SpecOf(Contract c) { return Table().at(static_cast<std::size_t>(c)); }

Contract RegisterContract(ContractSpec spec) {
  if (Table().size() >= 32) throw std::length_error("RegisterContract: 32 contracts at most");
  Table().push_back(std::move(spec));
  return static_cast<Contract>(Table().size() - 1);
}

void UnregisterContract(Contract c) {
  if (static_cast<std::size_t>(c) + 1 != Table().size() ||
      Table().size() <= CrunContracts().size()) {
    throw std::logic_error("UnregisterContract: only the last registered contract");
  }
  Table().pop_back();
}

std::vector<Contract> ContractSet::contracts() const {
  std::vector<Contract> out;
  for (std::size_t i = 0; i < Table().size(); ++i) {
    if (Has(static_cast<Contract>(i))) out.push_back(static_cast<Contract>(i));
  }
  return out;
}

std::string ContractSet::ToString() const {
  std::string out;
  for (Contract c : contracts()) out += (out.empty() ? "" : ",") + SpecOf(c).name;
  if (!Known()) out += ",unknown contracts (bits " + std::to_string(bits_ & ~AllBits()) + ")";
  return out;
}

bool ContractSet::NeedsPorts() const {
  const auto c = contracts();
  return std::any_of(c.begin(), c.end(),
                     [](Contract x) { return SpecOf(x).ports != ContractSpec::Ports::kNone; });
}

bool ContractSet::Known() const { return (bits_ & ~AllBits()) == 0; }

ContractSet ContractSet::FromBits(std::uint32_t bits) {
  ContractSet set;
  set.bits_ |= bits;
  return set;
}

std::vector<std::string> ContractNames() {
  std::vector<std::string> names;
  for (const auto& s : Table()) names.push_back(s.name);
  for (const auto& s : Table()) names.insert(names.end(), s.aliases.begin(), s.aliases.end());
  return names;
}

std::string DescribeContracts() {
  std::vector<std::string> items;
  for (std::size_t i = 1; i < Table().size(); ++i) {  // torch, always given, is torchrun's
    const ContractSpec& s = Table()[i];
    std::string note = Join(s.aliases);
    if (!s.gives.empty()) note += (note.empty() ? "" : ": ") + s.gives;
    items.push_back(note.empty() ? s.name : s.name + " (" + note + ")");
  }
  return "Also give workers the launch contract of these frameworks, comma-separated, on top of "
         "torchrun's: " +
         Join(items) + "; docs/frameworks.md";
}

StatusOr<ContractSet> ParseContracts(const std::string& list) {
  ContractSet set;
  std::stringstream in(list);
  std::string word;
  bool any = false;
  while (std::getline(in, word, ',')) {
    any = true;
    const auto& table = Table();
    const auto found = std::find_if(table.begin(), table.end(), [&](const ContractSpec& s) {
      return s.name == word || std::count(s.aliases.begin(), s.aliases.end(), word) != 0;
    });
    if (found != table.end()) {
      set.Add(static_cast<Contract>(found - table.begin()));
      continue;
    }
    std::string message = "unknown contract '" + word + "'";
    if (const std::string best = ClosestName(word, ContractNames()); !best.empty()) {
      message += " (did you mean " + best + "?)";
    }
    std::vector<std::string> known;
    for (const auto& s : table) {
      known.push_back(s.aliases.empty() ? s.name : s.name + " (" + Join(s.aliases) + ")");
    }
    return InvalidArgument(message + "; known: " + Join(known));
  }
  if (!any || list.back() == ',') {
    return InvalidArgument("--contract '" + list +
                           "' names no contract: give a comma-separated list such as "
                           "'tensorflow' or 'jax,mpi'");
  }
  return set;
}

PortLayout::PortLayout(const ContractSet& contracts, int nproc)
    : contracts_(contracts), nproc_(std::max(nproc, 0)), first_(Table().size(), -1) {
  using Ports = ContractSpec::Ports;
  int next = 0;
  for (Ports kind : {Ports::kPerWorker, Ports::kPerNode}) {
    for (Contract c : contracts.contracts()) {
      if (SpecOf(c).ports != kind) continue;
      first_[static_cast<std::size_t>(c)] = next;
      next += kind == Ports::kPerWorker ? nproc_ : 1;
    }
    if (kind == Ports::kPerWorker) worker_ports_ = next;
  }
  count_ = next;
}

std::optional<std::size_t> PortLayout::Port(Contract c, int local_rank) const {
  const auto i = static_cast<std::size_t>(c);
  if (i >= first_.size() || first_[i] < 0) return std::nullopt;
  if (SpecOf(c).ports != ContractSpec::Ports::kPerWorker) return first_[i];
  if (local_rank < 0 || local_rank >= nproc_) return std::nullopt;
  return static_cast<std::size_t>(first_[i] + local_rank);
}

Status PortLayout::Check(std::size_t reserved) const {
  if (reserved == static_cast<std::size_t>(count_)) return Status::Ok();
  return InvalidArgument(std::to_string(reserved) + " reserved ports for " +
                         std::to_string(nproc_) + (nproc_ == 1 ? " worker" : " workers") +
                         " where --contract " + contracts_.ToString() + " needs " +
                         std::to_string(count_));
}

std::uint16_t ContractRound::Port(std::size_t node, Contract c, int lr) const {
  const ContractNode& n = nodes.at(node);
  return n.ports.at(PortLayout(contracts, n.nproc).Port(c, lr).value());
}

}  // namespace crun
