// SPDX-License-Identifier: Apache-2.0
// Device variant of harness.hpp, shared by the CUDA tests (in-process device group, NCCL):
// - run_case_device(): the shared cases (cases.hpp) end to end on device memory, on one rank of
//   any communicator: seq→head checked bit for bit against the slice of the global tensor (and
//   the sentinel outside the output's layout), then head→seq checked against the input shard;
// - compare_executors(): every block list of a case run by CudaExecutor on device memory and by
//   HostExecutor on host memory from the same bytes, compared byte for byte (all buffers);
// - run_local_device(): a case on a DeviceLocalGroup (P virtual ranks on the current device).
// Values and layouts come from harness.hpp (value, position, sentinel, global_token), so a case
// means the same on every backend.
#pragma once

#include <ulysses/comm/local_device.cuh>
#include <ulysses/cuda/executor.cuh>

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cases.hpp"

namespace ut {

/// Throws std::runtime_error naming the call when a CUDA call of the test itself fails.
inline void cuda_ok(cudaError_t e, const char* expr, const char* file, int line) {
  if (e == cudaSuccess) return;
  std::ostringstream m;
  m << file << ":" << line << ": " << expr << ": " << cudaGetErrorName(e) << ": " << cudaGetErrorString(e);
  throw std::runtime_error(m.str());
}
#define UT_CUDA(expr) ::ut::cuda_ok((expr), #expr, __FILE__, __LINE__)

/// Number of CUDA devices (0 when the runtime or the driver reports none or fails).
inline int device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

/// Device memory owned by a test: `bytes` usable bytes starting `misalign` bytes after a
/// 256-byte aligned cudaMalloc base.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes, std::size_t misalign = 0) : bytes_(bytes), misalign_(misalign) {
    UT_CUDA(cudaMalloc(&base_, bytes + misalign + 1));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(base_, o.base_), std::swap(bytes_, o.bytes_), std::swap(misalign_, o.misalign_);
    return *this;
  }
  ~DeviceBuffer() {
    if (base_) cudaFree(base_);
  }
  std::byte* get() const { return static_cast<std::byte*>(base_) + misalign_; }
  std::size_t bytes() const { return bytes_; }
  /// Copies `bytes()` bytes from host memory, in stream order.
  void upload(const void* host, cudaStream_t s) const {
    if (bytes_) UT_CUDA(cudaMemcpyAsync(get(), host, bytes_, cudaMemcpyHostToDevice, s));
  }
  /// Copies `bytes()` bytes to host memory and waits for the stream.
  void download(void* host, cudaStream_t s) const {
    if (bytes_) UT_CUDA(cudaMemcpyAsync(host, get(), bytes_, cudaMemcpyDeviceToHost, s));
    UT_CUDA(cudaStreamSynchronize(s));
  }

 private:
  void* base_ = nullptr;
  std::size_t bytes_ = 0, misalign_ = 0;
};

/// A non-blocking stream owned by a test (on the current device).
class Stream {
 public:
  Stream() { UT_CUDA(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  Stream(Stream&& o) noexcept : s_(o.s_) { o.s_ = nullptr; }
  ~Stream() {
    if (s_) cudaStreamDestroy(s_);
  }
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

/// Rank r's seq-sharded tensor t of case c: the global values at its tokens, the sentinel in
/// the layout's gaps (as run_case fills its inputs).
template <class T>
std::vector<T> seq_shard(const ulysses::Plan& plan, const Case& c, int t, int r) {
  const ulysses::Layout& sl = plan.seq_layout(t);
  const std::int64_t S = c.seq.seq_len(), H = c.tensors[t].heads.num_heads(), D = c.tensors[t].D;
  std::vector<T> v(static_cast<std::size_t>(sl.span_elems()), sentinel<T>());
  const std::vector<std::int64_t> tok = global_tokens(c.seq, r);
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t ls = 0; ls < sl.extent[1]; ++ls)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t d = 0; d < D; ++d)
          v[static_cast<std::size_t>(sl.offset(b, ls, h, d))] = value<T>(position(t, b, tok[static_cast<std::size_t>(ls)], h, d, S, H, D, c.B));
  return v;
}

/// What rank r's head-sharded tensor t of case c must hold: the global values of its heads at
/// every token, the sentinel in the layout's gaps (what run_case checks).
template <class T>
std::vector<T> head_shard(const ulysses::Plan& plan, const Case& c, int t, int r) {
  const ulysses::Layout& hl = plan.head_layout(t);
  const std::int64_t S = c.seq.seq_len(), H = c.tensors[t].heads.num_heads(), D = c.tensors[t].D;
  const std::int64_t h0 = c.tensors[t].heads.begin(r);
  std::vector<T> v(static_cast<std::size_t>(hl.span_elems()), sentinel<T>());
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t s = 0; s < S; ++s)
      for (std::int64_t h = 0; h < hl.extent[2]; ++h)
        for (std::int64_t d = 0; d < D; ++d)
          v[static_cast<std::size_t>(hl.offset(b, s, h, d))] = value<T>(position(t, b, s, h0 + h, d, S, H, D, c.B));
  return v;
}

/// What head→seq(seq→head(x)) leaves in rank r's seq-sharded tensor t: the input shard, with
/// each element of a head whose replicas the plan sums replaced by their sum (round_trip_value).
template <class T>
std::vector<T> round_trip_shard(const ulysses::Plan& plan, const Case& c, int t, int r) {
  std::vector<T> v = seq_shard<T>(plan, c, t, r);
  const ulysses::Layout& sl = plan.seq_layout(t);
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t ls = 0; ls < sl.extent[1]; ++ls)
      for (std::int64_t h = 0; h < sl.extent[2]; ++h)
        for (std::int64_t d = 0; d < sl.extent[3]; ++d) {
          const auto o = static_cast<std::size_t>(sl.offset(b, ls, h, d));
          v[o] = round_trip_value<T>(plan, t, h, v[o]);
        }
  return v;
}

/// "" when a and b hold the same bytes, else where they first differ (element index).
template <class T>
std::string first_difference(const std::vector<T>& got, const std::vector<T>& want) {
  if (got.size() != want.size()) return "sizes differ";
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!same_bits(got[i], want[i])) return "first wrong element at offset " + std::to_string(i);
  return "";
}

/// Runs case c on rank `comm.rank()` on device memory with a CudaExecutor on stream s: seq→head
/// into sentinel-filled outputs, compared bit for bit with the expected head shard (sentinel
/// outside the layout included), then head→seq of that output into sentinel-filled buffers,
/// compared with the input shard. `move(plan, dir, exec, in, out, ws)` performs each
/// redistribution (redistribute() by default, a CudaPipeline in the pipeline tests). Returns ""
/// or what went wrong. Comm is any communicator whose exchange is ordered on s
/// (DeviceLocalGroup::Comm, NcclComm).
template <class T, class Comm, class Move>
std::string run_case_device_with(Comm& comm, const Case& c, cudaStream_t s, Move&& move) {
  using namespace ulysses;
  const int r = comm.rank();
  const Plan plan = plan_of<T>(c, r);
  const int NT = plan.num_tensors();
  std::vector<std::vector<T>> in(NT), want(NT);
  std::vector<DeviceBuffer> d_in, d_mid, d_back;
  TensorList<ConstByteSpan> ip, mp_c;
  TensorList<ByteSpan> mp, bp;
  for (int t = 0; t < NT; ++t) {
    in[t] = seq_shard<T>(plan, c, t, r);
    want[t] = head_shard<T>(plan, c, t, r);
    const std::vector<T> sent_mid(want[t].size(), sentinel<T>()), sent_back(in[t].size(), sentinel<T>());
    d_in.emplace_back(in[t].size() * sizeof(T));
    d_mid.emplace_back(want[t].size() * sizeof(T));
    d_back.emplace_back(in[t].size() * sizeof(T));
    d_in.back().upload(in[t].data(), s);
    d_mid.back().upload(sent_mid.data(), s);
    d_back.back().upload(sent_back.data(), s);
    UT_CUDA(cudaStreamSynchronize(s));  // the sentinel vectors die here
  }
  for (int t = 0; t < NT; ++t) {
    ip.push_back({d_in[t].get(), d_in[t].bytes()});
    mp.push_back({d_mid[t].get(), d_mid[t].bytes()});
    mp_c.push_back({d_mid[t].get(), d_mid[t].bytes()});
    bp.push_back({d_back[t].get(), d_back[t].bytes()});
  }
  DeviceBuffer ws(plan.workspace_bytes());
  CudaExecutor ex(plan, s);  // its upload is ordered on s, before the redistributions
  const Workspace w{ws.get(), ws.bytes()};
  std::string err;
  auto fail = [&](const std::string& what) {
    if (err.empty()) err = c.name + " rank " + std::to_string(r) + ": " + what;
  };
  move(plan, Direction::seq_to_head, ex, ip, mp, w);
  for (int t = 0; t < NT; ++t) {
    std::vector<T> got(want[t].size());
    d_mid[t].download(got.data(), s);
    const std::string d = first_difference(got, want[t]);
    if (!d.empty()) fail("seq_to_head tensor " + std::to_string(t) + ": " + d);
  }
  move(plan, Direction::head_to_seq, ex, mp_c, bp, w);
  for (int t = 0; t < NT; ++t) {
    std::vector<T> got(in[t].size());
    d_back[t].download(got.data(), s);
    const std::string d = first_difference(got, round_trip_shard<T>(plan, c, t, r));
    if (!d.empty()) fail("head_to_seq(seq_to_head(x)) != x (or its replicas' sum) for tensor " + std::to_string(t) + ": " + d);
  }
  return err;
}

/// run_case_device_with() through redistribute().
template <class T, class Comm>
std::string run_case_device(Comm& comm, const Case& c, cudaStream_t s) {
  return run_case_device_with<T>(comm, c, s,
                                 [&](const ulysses::Plan& plan, ulysses::Direction d, ulysses::CudaExecutor& ex,
                                     const ulysses::TensorList<ulysses::ConstByteSpan>& in, const ulysses::TensorList<ulysses::ByteSpan>& out,
                                     ulysses::Workspace w) { ulysses::redistribute(plan, d, comm, ex, in, out, w); });
}

/// C7 on device memory: the seq-sharded input of every rank is the view x[:, 4:12] of a
/// [B=2, 16, H=2, D=4] bshd buffer; head→seq writes the same view of another such buffer.
/// Checks the head shard and that the round trip rewrites exactly the view (as run_view_case).
template <class T, class Comm>
std::string run_view_case_device(Comm& comm, int P, cudaStream_t s) {
  using namespace ulysses;
  const int r = comm.rank();
  const std::int64_t B = 2, X = 16, H = 2, D = 4, L = 8, S = L * P;
  const Layout view = Layout::strided({B, L, H, D}, {X * H * D, H * D, D, 1});
  const std::int64_t base = 4 * H * D;
  auto hp = HeadPartition::even(H, P);
  const Plan plan({P, r}, B, SeqPartition::even(S, P), {TensorSpec::of<T>(hp, D).with_seq_layout(view)});
  std::vector<T> x(static_cast<std::size_t>(B * X * H * D), sentinel<T>());
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < L; ++t)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t d = 0; d < D; ++d)
          x[static_cast<std::size_t>(base + view.offset(b, t, h, d))] = value<T>(position(0, b, r * L + t, h, d, S, H, D, B));
  const Layout& hl = plan.head_layout(0);
  std::vector<T> want(static_cast<std::size_t>(hl.span_elems()), sentinel<T>());
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < S; ++t)
      for (std::int64_t h = 0; h < hl.extent[2]; ++h)
        for (std::int64_t d = 0; d < D; ++d)
          want[static_cast<std::size_t>(hl.offset(b, t, h, d))] = value<T>(position(0, b, t, hp.begin(r) + h, d, S, H, D, B));
  const std::vector<T> sent(x.size(), sentinel<T>()), sent_mid(want.size(), sentinel<T>());
  DeviceBuffer dx(x.size() * sizeof(T)), dy(x.size() * sizeof(T)), dmid(want.size() * sizeof(T)), ws(plan.workspace_bytes());
  dx.upload(x.data(), s);
  dy.upload(sent.data(), s);
  dmid.upload(sent_mid.data(), s);
  CudaExecutor ex(plan, s);
  const Workspace w{ws.get(), ws.bytes()};
  const std::size_t view_bytes = dx.bytes() - static_cast<std::size_t>(base) * sizeof(T);
  seq_to_head(plan, comm, ex, ConstByteSpan{dx.get() + base * static_cast<std::int64_t>(sizeof(T)), view_bytes},
              ByteSpan{dmid.get(), dmid.bytes()}, w);
  std::vector<T> got(want.size());
  dmid.download(got.data(), s);
  std::string d = first_difference(got, want);
  if (!d.empty()) return "C7 rank " + std::to_string(r) + ": seq_to_head: " + d;
  head_to_seq(plan, comm, ex, ConstByteSpan{dmid.get(), dmid.bytes()},
              ByteSpan{dy.get() + base * static_cast<std::int64_t>(sizeof(T)), view_bytes}, w);
  std::vector<T> y(x.size());
  dy.download(y.data(), s);
  d = first_difference(y, x);
  if (!d.empty()) return "C7 rank " + std::to_string(r) + ": head_to_seq into the view: " + d;
  return "";
}

/// Runs fn(comm) on a DeviceLocalGroup of P ranks on the current device, each rank with its
/// own stream; returns every rank's failures (and any exception) as one string.
template <class F>
std::string on_device_group(int P, F&& fn) {
  std::vector<Stream> streams(static_cast<std::size_t>(P));
  std::vector<cudaStream_t> handles;
  for (auto& s : streams) handles.push_back(s.get());
  std::vector<std::string> err(static_cast<std::size_t>(P));
  try {
    ulysses::DeviceLocalGroup g(P);
    g.spawn(handles.data(), [&](ulysses::DeviceLocalGroup::Comm& comm) {
      err[static_cast<std::size_t>(comm.rank())] = fn(comm);
    });
  } catch (const std::exception& e) {
    return e.what();
  }
  std::string all;
  for (auto& e : err) all += e.empty() ? "" : e + "\n";
  return all;
}

/// The transports a device communicator type can run with the CUDA executor.
template <class Comm>
std::vector<ulysses::Path> device_paths() {
  std::vector<ulysses::Path> v{ulysses::Path::alltoallv};
  if (ulysses::PathSupport<Comm, ulysses::CudaExecutor>::messages) v.push_back(ulysses::Path::messages);
  if (ulysses::PathSupport<Comm, ulysses::CudaExecutor>::direct) v.push_back(ulysses::Path::direct);
  return v;
}

/// Case c end to end on a DeviceLocalGroup (P virtual ranks on the current device), on every
/// transport it can run (c.path: Path::automatic means each in turn).
template <class T>
std::string run_local_device(const Case& c) {
  std::string all;
  for (ulysses::Path path : device_paths<ulysses::DeviceLocalGroup::Comm>()) {
    if (c.path != ulysses::Path::automatic && c.path != path) continue;
    Case k = c;
    k.path = path;
    const std::string e =
        on_device_group(k.P, [&](ulysses::DeviceLocalGroup::Comm& comm) { return run_case_device<T>(comm, k, comm.stream()); });
    if (!e.empty()) all += std::string("[") + to_string(path) + "] " + e;
  }
  return all;
}

/// Deterministic pseudo-random bytes (what "received" wire data and inputs hold in
/// compare_executors: every byte matters, not only the element values).
inline void fill_random(std::vector<std::byte>& v, std::uint64_t seed) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& b : v) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    b = static_cast<std::byte>(x >> 24);
  }
}

/// The buffers one direction of a plan touches, with the bytes they start from: inputs and the
/// receive region hold random bytes (every byte matters, not only element values), outputs and
/// the send region a sentinel. The send and receive regions are the workspace's two halves
/// (all stages' chunks).
struct ListBuffers {
  std::vector<int> index;                     ///< BufferTable index of each buffer
  std::vector<std::vector<std::byte>> bytes;  ///< initial contents
};
inline ListBuffers list_buffers(const ulysses::Plan& plan, ulysses::Direction dir) {
  using namespace ulysses;
  ListBuffers b;
  auto add = [&](int index, std::size_t n, bool random) {
    b.index.push_back(index);
    b.bytes.emplace_back(n, std::byte{0x5a});
    if (random) fill_random(b.bytes.back(), 7919 * static_cast<std::uint64_t>(index) + 1);
  };
  for (int t = 0; t < plan.num_tensors(); ++t) {
    add(BufferIndex::input(t), plan.input_bytes(dir, t), true);
    add(BufferIndex::output(t), plan.output_bytes(dir, t), false);
  }
  add(BufferIndex::send, plan.recv_region_offset(), false);
  add(BufferIndex::recv, plan.workspace_bytes() - plan.recv_region_offset(), true);
  return b;
}

/// Misalignment of buffer i of a comparison: `(misalign * (i + 1)) % 16` bytes after a
/// 256-byte boundary, so that sources and destinations are misaligned differently.
inline std::size_t misalignment(std::size_t misalign, std::size_t i) { return (misalign * (i + 1)) % 16; }

inline std::string describe_difference(const ulysses::Plan& plan, const std::string& name, ulysses::Direction dir,
                                       std::size_t misalign, int index, const std::vector<std::byte>& got,
                                       const std::vector<std::byte>& want, const char* who) {
  std::size_t k = 0;
  while (k < got.size() && got[k] == want[k]) ++k;
  return name + " rank " + std::to_string(plan.rank()) + " " +
         (dir == ulysses::Direction::seq_to_head ? "seq_to_head" : "head_to_seq") + " misalign " + std::to_string(misalign) +
         ": buffer " + std::to_string(index) + " of the " + who + " differs from the host executor's at byte " + std::to_string(k);
}

/// For both directions of a plan, runs every stage's pack list then unpack list with HostExecutor
/// on host buffers and with CudaExecutor (one launch each) on device buffers that start from the
/// same bytes (list_buffers), and compares every buffer byte for byte. Buffers are misaligned
/// as misalignment() says (0: all aligned), to exercise the kernel's narrower copies.
inline std::string compare_executors(const ulysses::Plan& plan, const std::string& name, std::size_t misalign,
                                     cudaStream_t s) {
  using namespace ulysses;
  for (Direction dir : {Direction::seq_to_head, Direction::head_to_seq}) {
    ListBuffers b = list_buffers(plan, dir);
    std::vector<DeviceBuffer> dev;
    BufferTable host_t, dev_t;
    for (std::size_t i = 0; i < b.bytes.size(); ++i) {
      dev.emplace_back(b.bytes[i].size(), misalignment(misalign, i));
      dev.back().upload(b.bytes[i].data(), s);
      host_t.base[b.index[i]] = b.bytes[i].data();
      dev_t.base[b.index[i]] = dev.back().get();
    }
    UT_CUDA(cudaStreamSynchronize(s));  // uploads done before the host executor changes the host bytes
    CudaExecutor ex(plan, s);
    for (int k = 0; k < plan.num_stages(); ++k) {
      const StageLists& sc = plan.stage_lists(dir, k);
      ex.run(sc.pack.data(), sc.pack.size(), dev_t);
      ex.run(sc.unpack.data(), sc.unpack.size(), dev_t);
      HostExecutor{}.run(sc.pack.data(), sc.pack.size(), host_t);
      HostExecutor{}.run(sc.unpack.data(), sc.unpack.size(), host_t);
    }
    for (std::size_t i = 0; i < b.bytes.size(); ++i) {
      std::vector<std::byte> got(b.bytes[i].size());
      dev[i].download(got.data(), s);
      if (got != b.bytes[i]) return describe_difference(plan, name, dir, misalign, b.index[i], got, b.bytes[i], "CUDA executor");
    }
  }
  return "";
}

/// Runs a list as the copy kernel would, on the host: every unit, every thread of its CTA in
/// turn, in the kernel's phases (tabulate the rows, then copy); the threads share nothing else,
/// so this is exact. Checks the kernel's arithmetic (units, vector widths, row offsets) where
/// no GPU is available.
inline void emulate_kernel(const ulysses::BlockCopy* blocks, std::size_t n, const ulysses::BufferTable& t) {
  using namespace ulysses::detail;
  if (n == 0) return;
  const KernelList l = kernel_list(blocks, n);
  auto rt = std::make_unique<RowTable>();
  for (std::int64_t u = 0; u < l.unit_begin.back(); ++u) {
    const KernelBlock* b = nullptr;
    const Unit w = find_unit(l.blocks.data(), l.unit_begin.data(), static_cast<int>(n), u, t, b);
    if (w.tabulated)
      for (int tid = 0; tid < kCopyThreads; ++tid) tabulate_rows(*b, w, tid, *rt);
    for (int tid = 0; tid < kCopyThreads; ++tid) run_unit(b, w, tid, *rt, t);
  }
}

/// compare_executors with the kernel emulated on the host (emulate_kernel) instead of launched.
inline std::string compare_emulated(const ulysses::Plan& plan, const std::string& name, std::size_t misalign) {
  using namespace ulysses;
  for (Direction dir : {Direction::seq_to_head, Direction::head_to_seq}) {
    ListBuffers want = list_buffers(plan, dir);
    std::vector<std::vector<std::byte>> arena;
    BufferTable host_t, emu_t;
    for (std::size_t i = 0; i < want.bytes.size(); ++i) {
      arena.emplace_back(want.bytes[i].size() + 256 + 16);
      auto at = reinterpret_cast<std::uintptr_t>(arena.back().data());
      std::byte* p = arena.back().data() + ((256 - at % 256) % 256) + misalignment(misalign, i);
      std::memcpy(p, want.bytes[i].data(), want.bytes[i].size());
      host_t.base[want.index[i]] = want.bytes[i].data();
      emu_t.base[want.index[i]] = p;
    }
    for (int k = 0; k < plan.num_stages(); ++k) {
      const StageLists& sc = plan.stage_lists(dir, k);
      emulate_kernel(sc.pack.data(), sc.pack.size(), emu_t);
      emulate_kernel(sc.unpack.data(), sc.unpack.size(), emu_t);
      HostExecutor{}.run(sc.pack.data(), sc.pack.size(), host_t);
      HostExecutor{}.run(sc.unpack.data(), sc.unpack.size(), host_t);
    }
    for (std::size_t i = 0; i < want.bytes.size(); ++i) {
      const std::vector<std::byte> got(emu_t.base[want.index[i]], emu_t.base[want.index[i]] + want.bytes[i].size());
      if (got != want.bytes[i])
        return describe_difference(plan, name, dir, misalign, want.index[i], got, want.bytes[i], "emulated kernel");
    }
  }
  return "";
}

/// compare_executors for every rank of case c with element type T.
template <class T>
std::string compare_executors(const Case& c, std::size_t misalign, cudaStream_t s) {
  for (int r = 0; r < c.P; ++r) {
    const std::string e = compare_executors(plan_of<T>(c, r), c.name, misalign, s);
    if (!e.empty()) return e;
  }
  return "";
}

/// compare_emulated for every rank of case c with element type T.
template <class T>
std::string compare_emulated(const Case& c, std::size_t misalign) {
  for (int r = 0; r < c.P; ++r) {
    const std::string e = compare_emulated(plan_of<T>(c, r), c.name, misalign);
    if (!e.empty()) return e;
  }
  return "";
}

}  // namespace ut
