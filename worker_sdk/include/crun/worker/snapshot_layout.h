// The layout of a snapshot in crun's node memory (docs/checkpoints.md): the one definition
// that the agent (which owns the memory, seals and verifies it) and the workers' SDKs (C++
// here, Python in worker_sdk/python/crun_worker.py, which follows it field by field) share.
// Header-only and plain C++, like env_names.h.
//
// Each local rank has a slot of two buffers, each a file in shared memory that crun created and
// sized. A buffer is a 4 KiB header, then the payload: a table of contents, then the items'
// bytes, each at a 64-byte aligned offset from the payload's start. A tensor is its raw bytes
// (dtype and shape in the table); small plain values are one encoded item of their own.
//
// Saving is double-buffered: a worker writes the buffer that does not hold the newest complete
// snapshot, marking it kWriting first and kComplete last (with a generation one above the
// other buffer's), so a worker killed mid-save leaves the other buffer whole. crun seals a
// complete buffer with a checksum of its payload (tagged with the generation it covers) and
// checks it again before a load hands the buffer out.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace crun::snapshot {

inline constexpr char kMagic[8] = {'C', 'R', 'U', 'N', 'S', 'N', 'P', '1'};
inline constexpr std::uint32_t kVersion = 1;
inline constexpr std::size_t kHeaderBytes = 4096;
inline constexpr std::size_t kAlign = 64;

enum State : std::uint32_t { kEmpty = 0, kWriting = 1, kComplete = 2 };
// How the state is spread over the ranks: each rank's own part (a rank may load only its own,
// saved by a world of the same size), or the same on every rank (DDP: any rank may load it).
enum Layout : std::uint32_t { kSharded = 1, kReplicated = 2 };

// At offset 0 of every buffer. Little-endian, fixed offsets (the Python SDK packs the same).
struct BufferHeader {
  char magic[8];                      // 0
  std::uint32_t version;              // 8
  std::uint32_t state;                // 12: State; written last on a save
  std::uint64_t generation;           // 16: 1 + the other buffer's, set with kComplete
  std::uint64_t step;                 // 24
  std::uint64_t payload_bytes;        // 32: table of contents and items
  std::uint64_t toc_bytes;            // 40
  std::int64_t rank;                  // 48: RANK of the writer
  std::int64_t world_size;            // 56: WORLD_SIZE of the writer
  std::uint32_t layout;               // 64: Layout
  std::uint32_t reserved;             // 68
  std::uint64_t saved_unix_ns;        // 72
  std::uint64_t checksum;             // 80: XXH3-64 of the payload, written by crun
  std::uint64_t checksum_generation;  // 88: the generation `checksum` covers (0: none)
};
static_assert(sizeof(BufferHeader) == 96);

inline std::uint32_t LoadState(const BufferHeader& h) {
  return std::atomic_ref<const std::uint32_t>(h.state).load(std::memory_order_acquire);
}
inline void StoreState(BufferHeader& h, State s) {
  std::atomic_ref<std::uint32_t>(h.state).store(s, std::memory_order_release);
}
// Whether crun is done with a buffer's content, so that a save may overwrite it: nothing
// complete in it, or a complete snapshot that crun has sealed (and copied first when it goes
// to disk).
inline bool DoneWith(const BufferHeader& h) {
  if (LoadState(h) != kComplete) return true;
  return std::atomic_ref<const std::uint64_t>(h.checksum_generation)
             .load(std::memory_order_acquire) == h.generation;
}
inline bool HasMagic(const BufferHeader& h) {
  return std::memcmp(h.magic, kMagic, sizeof kMagic) == 0 && h.version == kVersion;
}

inline std::uint64_t AlignUp(std::uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// One entry of the table of contents. dtype is PyTorch's name ("float32", "bfloat16",
// "int64", ...) or "bytes" for an encoded item.
struct Item {
  std::string name;
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::uint64_t offset = 0;  // from the payload's start
  std::uint64_t bytes = 0;
};

// The table of contents: u32 count, then per item u16 name length, the name, u8 dtype length,
// the dtype, u8 dimensions, i64 per dimension, u64 offset, u64 bytes.
inline std::size_t TocBytes(const std::vector<Item>& items) {
  std::size_t n = 4;
  for (const Item& i : items)
    n += 2 + i.name.size() + 1 + i.dtype.size() + 1 + 8 * i.shape.size() + 16;
  return n;
}

// Gives each item its offset (after the table, aligned) and returns the payload's size.
inline std::uint64_t PlaceItems(std::vector<Item>& items) {
  std::uint64_t at = AlignUp(TocBytes(items));
  for (Item& i : items) {
    i.offset = at;
    at = AlignUp(at + i.bytes);
  }
  return at;
}

namespace detail {
template <typename T>
inline void Put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}
template <typename T>
inline bool Get(std::string_view& in, T* v) {
  if (in.size() < sizeof(T)) return false;
  std::memcpy(v, in.data(), sizeof(T));
  in.remove_prefix(sizeof(T));
  return true;
}
}  // namespace detail

inline std::string EncodeToc(const std::vector<Item>& items) {
  std::string out;
  out.reserve(TocBytes(items));
  detail::Put<std::uint32_t>(out, static_cast<std::uint32_t>(items.size()));
  for (const Item& i : items) {
    detail::Put<std::uint16_t>(out, static_cast<std::uint16_t>(i.name.size()));
    out += i.name;
    detail::Put<std::uint8_t>(out, static_cast<std::uint8_t>(i.dtype.size()));
    out += i.dtype;
    detail::Put<std::uint8_t>(out, static_cast<std::uint8_t>(i.shape.size()));
    for (std::int64_t d : i.shape) detail::Put<std::int64_t>(out, d);
    detail::Put<std::uint64_t>(out, i.offset);
    detail::Put<std::uint64_t>(out, i.bytes);
  }
  return out;
}

// The items of a table of `toc` bytes in a payload of `payload_bytes`; none when malformed
// (an item past the payload's end included).
inline std::optional<std::vector<Item>> DecodeToc(std::string_view toc,
                                                  std::uint64_t payload_bytes) {
  using detail::Get;
  std::uint32_t count = 0;
  if (!Get(toc, &count) || count > toc.size()) return std::nullopt;
  std::vector<Item> items(count);
  for (Item& i : items) {
    std::uint16_t name_len = 0;
    std::uint8_t dtype_len = 0, ndim = 0;
    if (!Get(toc, &name_len) || toc.size() < name_len) return std::nullopt;
    i.name.assign(toc.substr(0, name_len));
    toc.remove_prefix(name_len);
    if (!Get(toc, &dtype_len) || toc.size() < dtype_len) return std::nullopt;
    i.dtype.assign(toc.substr(0, dtype_len));
    toc.remove_prefix(dtype_len);
    if (!Get(toc, &ndim)) return std::nullopt;
    i.shape.resize(ndim);
    for (auto& d : i.shape) {
      if (!Get(toc, &d)) return std::nullopt;
    }
    if (!Get(toc, &i.offset) || !Get(toc, &i.bytes)) return std::nullopt;
    if (i.offset > payload_bytes || i.bytes > payload_bytes - i.offset) return std::nullopt;
  }
  return items;
}

// The buffer to write next: not the one holding the newest complete snapshot.
inline int TargetBuffer(const BufferHeader* a, const BufferHeader* b) {
  const bool a_done = a != nullptr && HasMagic(*a) && LoadState(*a) == kComplete;
  const bool b_done = b != nullptr && HasMagic(*b) && LoadState(*b) == kComplete;
  if (a_done && b_done) return a->generation <= b->generation ? 0 : 1;
  if (a_done) return 1;
  return 0;
}

}  // namespace crun::snapshot
