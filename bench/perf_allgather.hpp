// SPDX-License-Identifier: Apache-2.0
// ulysses_perf --allgather-kv (--op allgather_kv): allgather_kv() (allgather.hpp) of k|v, each
// rank's seq-sharded [B, S_r, Hkv, D] and [B, S_r, Hkv, Dv] (--model's Hkv, D, Dv; bf16 unless
// --dtype) gathered into [B, S, Hkv, D|Dv] in global order on every rank, against the bare
// all-gather of the same bytes (each rank's k|v tokens, one contiguous block): MPI_Allgatherv
// under MPI, exchange_messages() of the block to every peer in process. Per S (the sweep's
// sizes), two splits of the sequence: even (one contiguous run a rank) and zigzag (two chunks a
// rank, the causal balance). Communicators: --backend local (LocalGroup::Comm), --backend mpi
// over MpiComm, or over MpiWindowComm (the peer copy; the default when every rank is on one node,
// --mpi-window 1|0, as the seq ops choose; --backend window: the window) with k, v and the
// gathered k_all, v_all in one MpiWindow (allgather_kv() pushes), and there a second baseline:
// MPI_Allgatherv between buffers of the same window. Time: alternate_all() of the three (or two)
// calls (the median over iterations of the slowest rank's time, each); ratio = ours / bare,
// same run. -c 1: one checked call of each: the gathered bytes against every rank's own (#wrong
// bytes, the library's and the baselines').
#pragma once

#include <ulysses/allgather.hpp>
#include <ulysses/ulysses.hpp>
#if ULYSSES_PERF_MPI
#include <ulysses/comm/mpi.hpp>
#endif

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "group.hpp"
#include "host_buffer.hpp"
#include "perf_documents.hpp"

namespace perf_allgather {

using namespace ulysses;
using Bytes = std::vector<std::byte, ub::HugePageAllocator<std::byte>>;

/// One line of the table.
struct Line {
  std::string split;       // "even", "zigzag"
  std::string path;        // the plan's path (choose_path)
  std::int64_t S = 0;
  double bytes = 0;        // bytes a rank ends with: k_all + v_all (the gathered sequence)
  double us = 0, bare_us = 0, win_us = 0;  // allgather_kv(); the bare all-gather; (window) MPI_Allgatherv in the window
  long long wrong = -1, bare_wrong = -1;   // -1: not checked
};

/// Seconds on `comm`'s clock: MPI_Wtime under MPI (as ulysses_perf's seconds_now()), else steady_clock.
#if ULYSSES_PERF_MPI
inline double now(const MpiComm&) { return MPI_Wtime(); }
#endif
template <class Comm>
double now(const Comm&) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
/// One call of fn() on every rank after a barrier: the slowest rank's microseconds. Collective.
template <class Comm, class F>
double slowest_us(Comm& comm, F&& fn) {
  ulysses_group::barrier(comm);
  const double t0 = now(comm);
  fn();
  return ulysses_group::max_over_ranks(comm, (now(comm) - t0) * 1e6);
}

/// The byte of tensor t (0 k, 1 v) at byte `i` of its whole [B, S, H, D] (the oracle: every
/// byte's value is a function of where it is in the gathered tensor).
inline std::byte pattern(int t, std::size_t i) {
  std::uint64_t x = (static_cast<std::uint64_t>(i) * 2 + static_cast<std::uint64_t>(t) + 1) * 0x9e3779b97f4a7c15ull;
  return static_cast<std::byte>((x >> 56) & 0xffu);
}

/// Where one line's buffers lie on this rank: k, v (seq-sharded), k_all, v_all (gathered), the
/// bare's block (k_r|v_r) and its receive buffer, and (window) the window bare's two.
struct Buffers {
  std::byte* in[2] = {nullptr, nullptr};
  std::byte* out[2] = {nullptr, nullptr};
  std::byte* block = nullptr;
  std::byte* gathered = nullptr;
  std::byte* win_block = nullptr;
  std::byte* win_gathered = nullptr;
};

/// A line's geometry: the plan, each rank's k|v block bytes (the bare's counts) and offsets.
struct Geometry {
  Plan plan;
  std::vector<std::size_t> counts, offsets;
  std::size_t in_bytes[2], out_bytes[2], total = 0;
};
template <class T>
Geometry geometry(int P, int r, std::int64_t B, const SeqPartition& seq, std::int64_t Hkv, std::int64_t D, std::int64_t Dv, ElementType type,
                  Path path) {
  PlanOptions opt;
  opt.path = path;
  Geometry g{Plan({P, r}, B, seq, allgather_kv_specs<T>(P, Hkv, D, Dv, type).kv(), Format::bshd, opt), {}, {}, {0, 0}, {0, 0}, 0};
  const std::size_t e = size_of(type);
  for (int t = 0; t < 2; ++t) {
    g.in_bytes[t] = g.plan.seq_bytes(t);
    g.out_bytes[t] = g.plan.head_bytes(t);
  }
  for (int p = 0; p < P; ++p) {
    g.offsets.push_back(g.total);
    g.counts.push_back(static_cast<std::size_t>(B * seq.local_length(p) * Hkv * (D + Dv)) * e);
    g.total += g.counts.back();
  }
  return g;
}

/// Rank p's seq-sharded tensor t (bshd, dense: [B, S_p, H, D_t]) into dst, from the oracle.
inline void fill_input(const SeqPartition& seq, int p, int t, std::int64_t B, std::size_t row, std::byte* dst) {
  const std::int64_t S = seq.seq_len(), Sp = seq.local_length(p);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t i = 0; i < Sp; ++i) {
      const std::size_t src = static_cast<std::size_t>(b * S + seq.global_token(p, i)) * row, at = static_cast<std::size_t>(b * Sp + i) * row;
      for (std::size_t x = 0; x < row; ++x) dst[at + x] = pattern(t, src + x);
    }
}

/// One line of allgather_kv() on this rank: `comm` runs the library call, `tcomm` times and runs
/// the host collectives (the MpiComm under MpiWindowComm), `bare(block, gathered)` one bare
/// all-gather of the k|v blocks, `win` (or null) the window's. Collective.
template <class Comm, class TComm, class Bare, class Alternate>
Line line_at(Comm& comm, TComm& tcomm, const Geometry& g, const SeqPartition& seq, const std::string& split, std::int64_t B, std::int64_t Hkv,
             std::int64_t D, std::int64_t Dv, ElementType type, const Buffers& buf, std::vector<std::byte>& ws, bool check, Bare&& bare,
             std::function<void()> win, Alternate&& alternate) {
  const int P = comm.size(), r = comm.rank();
  (void)P;
  const std::size_t e = size_of(type), rows[2] = {static_cast<std::size_t>(Hkv * D) * e, static_cast<std::size_t>(Hkv * Dv) * e};
  Line l;
  l.split = split;
  l.S = seq.seq_len();
  l.path = to_string(choose_path<Comm, HostExecutor>(g.plan));
  l.bytes = static_cast<double>(g.out_bytes[0] + g.out_bytes[1]);
  // The inputs, the bare's blocks (k_r then v_r: the same bytes), the outputs written once.
  for (int t = 0; t < 2; ++t) fill_input(seq, r, t, B, rows[t], buf.in[t]);
  for (std::byte* blk : {buf.block, buf.win_block})
    if (blk) std::memcpy(blk, buf.in[0], g.in_bytes[0]), std::memcpy(blk + g.in_bytes[0], buf.in[1], g.in_bytes[1]);
  for (int t = 0; t < 2; ++t) std::memset(buf.out[t], 0xee, g.out_bytes[t]);
  for (std::byte* got : {buf.gathered, buf.win_gathered})
    if (got) std::memset(got, 0xee, g.total);
  HostExecutor ex;
  const TensorList<ConstByteSpan> in{ConstByteSpan(buf.in[0], g.in_bytes[0]), ConstByteSpan(buf.in[1], g.in_bytes[1])};
  const TensorList<ByteSpan> out{ByteSpan(buf.out[0], g.out_bytes[0]), ByteSpan(buf.out[1], g.out_bytes[1])};
  auto ours = [&] { allgather_kv(g.plan, comm, ex, in, out, Workspace(ws)); };
  if (check) {
    ours();
    long long w = 0;
    for (int t = 0; t < 2; ++t)
      for (std::size_t i = 0; i < g.out_bytes[t]; ++i) w += buf.out[t][i] != pattern(t, i);
    bare(buf.block, buf.gathered);
    if (win) win();
    long long bw = 0;
    std::vector<std::byte> want;
    for (int p = 0; p < comm.size(); ++p) {  // rank p's block: its k then its v
      want.assign(g.counts[static_cast<std::size_t>(p)], std::byte{0});
      const std::size_t kb = static_cast<std::size_t>(B * seq.local_length(p)) * rows[0];
      fill_input(seq, p, 0, B, rows[0], want.data());
      fill_input(seq, p, 1, B, rows[1], want.data() + kb);
      for (std::byte* got : {buf.gathered, buf.win_gathered})
        if (got)
          for (std::size_t i = 0; i < want.size(); ++i) bw += got[g.offsets[static_cast<std::size_t>(p)] + i] != want[i];
    }
    l.wrong = ulysses_group::sum_over_ranks(tcomm, w);
    l.bare_wrong = ulysses_group::sum_over_ranks(tcomm, bw);
  }
  std::vector<std::function<double()>> calls{[&] { return slowest_us(tcomm, ours); },
                                             [&] { return slowest_us(tcomm, [&] { bare(buf.block, buf.gathered); }); }};
  if (win) calls.push_back([&] { return slowest_us(tcomm, win); });
  const std::vector<double> m = alternate(calls);
  l.us = m[0], l.bare_us = m[1], l.win_us = win ? m[2] : 0;
  return l;
}

/// The splits of S tokens over P ranks a sweep times: even (a run a rank), zigzag (chunks r and
/// 2P-1-r) and, with --docs, the packed documents' per-document zigzag (documents_partition()).
inline std::vector<std::pair<std::string, SeqPartition>> splits(std::int64_t S, int P, const perf_documents::Spec& docs) {
  std::vector<std::pair<std::string, SeqPartition>> v{{"even", SeqPartition::even(S, P)}, {"zigzag", SeqPartition::zigzag(S, P)}};
  if (docs.given) v.emplace_back("docs", documents_partition(perf_documents::documents(docs, S), P, DocumentSplit::zigzag));
  return v;
}

/// The element type's C++ stand-in for the specs (the gather copies bytes; the type is `type`).
template <class F>
void with_type(ElementType type, F&& f) {
  if (size_of(type) == 2) f(std::uint16_t{});
  else if (size_of(type) == 8) f(std::uint64_t{});
  else f(std::uint32_t{});
}

/// The sweep's lines on this rank of `comm` (LocalGroup::Comm or MpiComm, private buffers).
/// Collective. @returns the lines (every rank's alike).
template <class Comm, class Alternate>
std::vector<Line> run_private(Comm& comm, const std::vector<std::int64_t>& sizes, const perf_documents::Spec& docs, std::int64_t B, std::int64_t Hkv, std::int64_t D,
                              std::int64_t Dv, ElementType type, Path path, bool check, Alternate&& alternate) {
  std::vector<Line> lines;
  const int P = comm.size(), r = comm.rank();
  for (std::int64_t S : sizes)
    for (const auto& [split, seq] : splits(S, P, docs))
      with_type(type, [&](auto tag) {
        const Geometry g = geometry<decltype(tag)>(P, r, B, seq, Hkv, D, Dv, type, path);
        // One huge-page arena, every buffer at a 2 MiB boundary in it (as a caching allocator's
        // segment holds an engine's tensors): the library's k, v, k_all, v_all and the bare's
        // block and receive buffer are the same kind of memory whatever their sizes (separate
        // allocations would give huge pages only to those of 2 MiB or more: at S = 1024 the bare's
        // 2 MiB block against k and v of 1 MiB each at P = 2, and page pinning is most of a CMA copy).
        const std::size_t sizes_[6] = {g.in_bytes[0], g.in_bytes[1], g.out_bytes[0], g.out_bytes[1], g.counts[static_cast<std::size_t>(r)] + 1, g.total};
        std::size_t at[6], arena_bytes = 0;
        for (int i = 0; i < 6; ++i) {
          at[i] = arena_bytes;
          arena_bytes += (sizes_[i] + Bytes::allocator_type::kHuge - 1) / Bytes::allocator_type::kHuge * Bytes::allocator_type::kHuge;
        }
        Bytes arena(arena_bytes);
        std::vector<std::byte> ws(g.plan.workspace_bytes());
        Buffers buf;
        buf.in[0] = arena.data() + at[0], buf.in[1] = arena.data() + at[1], buf.out[0] = arena.data() + at[2], buf.out[1] = arena.data() + at[3];
        buf.block = arena.data() + at[4], buf.gathered = arena.data() + at[5];
        auto bare = [&](std::byte* blk, std::byte* got) {
#if ULYSSES_PERF_MPI
          if constexpr (std::is_same_v<Comm, MpiComm>) {
            std::vector<int> c(g.counts.begin(), g.counts.end()), o(g.offsets.begin(), g.offsets.end());
            MPI_Allgatherv(blk, c[static_cast<std::size_t>(r)], MPI_BYTE, got, c.data(), o.data(), MPI_BYTE, comm.get());
            return;
          }
#endif
          std::vector<Message> s, q;  // in process: the block to every peer, every peer's into its place, the own copied
          for (int p = 0; p < P; ++p) {
            if (p == r) continue;
            s.push_back(Message{p, blk, g.counts[static_cast<std::size_t>(r)]});
            q.push_back(Message{p, got + g.offsets[static_cast<std::size_t>(p)], g.counts[static_cast<std::size_t>(p)]});
          }
          comm.exchange_messages(s.data(), s.size(), q.data(), q.size());
          std::memcpy(got + g.offsets[static_cast<std::size_t>(r)], blk, g.counts[static_cast<std::size_t>(r)]);
        };
        lines.push_back(line_at(comm, comm, g, seq, split, B, Hkv, D, Dv, type, buf, ws, check, bare, {}, alternate));
      });
  return lines;
}

#if ULYSSES_PERF_MPI
/// The sweep over MpiWindowComm: per line an MpiWindow over `comm` holding k, v, k_all, v_all and
/// the window bare's two buffers (each the largest over ranks, so every rank allocates alike);
/// the bare MPI_Allgatherv between private buffers, and between the window's. Collective.
template <class Alternate>
std::vector<Line> run_window(MpiComm& comm, const std::vector<std::int64_t>& sizes, const perf_documents::Spec& docs, std::int64_t B, std::int64_t Hkv, std::int64_t D,
                             std::int64_t Dv, ElementType type, Path path, bool check, Alternate&& alternate) {
  std::vector<Line> lines;
  const int P = comm.size(), r = comm.rank();
  for (std::int64_t S : sizes)
    for (const auto& [split, seq] : splits(S, P, docs))
      with_type(type, [&](auto tag) {
        const Geometry g = geometry<decltype(tag)>(P, r, B, seq, Hkv, D, Dv, type, path);
        auto largest = [&](std::size_t n) { return static_cast<std::size_t>(ulysses_group::max_over_ranks(comm, static_cast<double>(n))) + 1; };
        const std::size_t sizes_[6] = {largest(g.in_bytes[0]), largest(g.in_bytes[1]), largest(g.out_bytes[0]), largest(g.out_bytes[1]),
                                       largest(g.counts[static_cast<std::size_t>(r)]), largest(g.total)};
        std::size_t total = std::size_t{1} << 20;
        for (std::size_t n : sizes_) total += (n + MpiWindow::kAlignment - 1) / MpiWindow::kAlignment * MpiWindow::kAlignment;
        MpiWindow win(comm, total);
        MpiWindowComm wc(comm, win);
        std::byte* at[6];
        for (int i = 0; i < 6; ++i) at[i] = win.allocate(sizes_[i]).data();
        Bytes block(g.counts[static_cast<std::size_t>(r)] + 1), gathered(g.total);
        std::vector<std::byte> ws(g.plan.workspace_bytes());
        Buffers buf;
        buf.in[0] = at[0], buf.in[1] = at[1], buf.out[0] = at[2], buf.out[1] = at[3], buf.win_block = at[4], buf.win_gathered = at[5];
        buf.block = block.data(), buf.gathered = gathered.data();
        std::vector<int> c(g.counts.begin(), g.counts.end()), o(g.offsets.begin(), g.offsets.end());
        auto bare = [&](std::byte* blk, std::byte* got) {
          MPI_Allgatherv(blk, c[static_cast<std::size_t>(r)], MPI_BYTE, got, c.data(), o.data(), MPI_BYTE, comm.get());
        };
        std::function<void()> in_window = [&] { bare(buf.win_block, buf.win_gathered); };
        lines.push_back(line_at(wc, comm, g, seq, split, B, Hkv, D, Dv, type, buf, ws, check, bare, in_window, alternate));
      });
  return lines;
}
#endif

/// Prints the table (rank 0). @returns 1 when a byte was wrong, else 0.
inline int print(const std::vector<Line>& lines, const std::string& comm, const std::string& model, std::int64_t Hkv, std::int64_t D,
                 std::int64_t Dv, ElementType type, std::int64_t B, int P, int iters, int warmup, bool check, bool window) {
  std::printf("# ulysses_perf --allgather-kv: allgather_kv() of k|v, %s (Hkv=%lld D=%lld Dv=%lld), %s, bshd, B=%lld, P=%d, %s, %d iters after %d warm-up%s\n",
              model.c_str(), static_cast<long long>(Hkv), static_cast<long long>(D), static_cast<long long>(Dv), to_string(type),
              static_cast<long long>(B), P, comm.c_str(), iters, warmup, check ? ", checked byte for byte" : "");
  std::printf("# each rank's seq-sharded k, v [B, S/P, Hkv, D] gathered whole [B, S, Hkv, D] in global order on every rank (even: a run a rank;\n"
              "# zigzag: chunks r and 2P-1-r); bytes: what a rank ends with (k_all + v_all); time: the median over iterations of the slowest\n"
              "# rank's, the calls alternating in one run; bare(us): %s of the same bytes (each rank's k|v tokens, one block);\n"
              "# ratio = time / bare%s\n",
              comm == "LocalGroup::Comm" ? "exchange_messages() of the block to every peer + the own copy" : "MPI_Allgatherv, private buffers",
              window ? "; win(us): MPI_Allgatherv between buffers of the same MpiWindow (k, v, k_all, v_all in it: allgather_kv() pushes); /win = time / win" : "");
  for (const Line& l : lines)
    if (l.split == "docs") {
      std::printf("# docs: --docs' packed documents, each cut into 2P chunks, rank r holding chunks r and 2P-1-r of each "
                  "(documents_partition(..., DocumentSplit::zigzag), TE's THD split)\n");
      break;
    }
  std::printf("#%-7s %8s %-10s %12s %10s %8s %10s %6s", "split", "S", "path", "bytes", "time(us)", "GB/s", "bare(us)", "ratio");
  if (window) std::printf(" %10s %6s", "win(us)", "/win");
  std::printf(" %7s\n", "#wrong");
  long long bad = 0;
  for (const Line& l : lines) {
    char wrong[48];
    if (l.wrong < 0) std::snprintf(wrong, sizeof wrong, "N/A");
    else std::snprintf(wrong, sizeof wrong, "%lld", l.wrong + l.bare_wrong);
    std::printf(" %-7s %8lld %-10s %12.0f %10.1f %8.2f %10.1f %6.3f", l.split.c_str(), static_cast<long long>(l.S), l.path.c_str(), l.bytes, l.us,
                l.bytes / l.us * 1e-3, l.bare_us, l.us / l.bare_us);
    if (window) std::printf(" %10.1f %6.3f", l.win_us, l.us / l.win_us);
    std::printf(" %7s\n", wrong);
    bad += (l.wrong > 0 ? l.wrong : 0) + (l.bare_wrong > 0 ? l.bare_wrong : 0);
  }
  if (check) std::printf("# wrong bytes: %lld %s\n", bad, bad ? "FAILED" : "OK");
  return bad ? 1 : 0;
}

/// --allgather-kv on `o` (ulysses_perf's Options): the flags it takes; exits (2) otherwise.
template <class O>
void check_options(const O& o) {
  if (o.backend != "local" && o.backend != "mpi" && o.backend != "window") {
    std::fprintf(stderr, "--allgather-kv runs on --backend local, mpi or window, not %s\n", o.backend.c_str());
    std::exit(2);
  }
  if (o.direction_given || o.backward || o.rope || o.groups != 1 || !o.copies || o.ranks_per_node > 0) {
    std::fprintf(stderr, "--allgather-kv takes none of --direction, --backward, --rope, --groups, --copies 0, --ranks-per-node\n");
    std::exit(2);
  }
}

/// The sweep's sizes of `o` (next(S): the one after S, 0 at the end).
template <class O, class Next>
std::vector<std::int64_t> sizes_of(const O& o, Next&& next) {
  if (o.docs.fixed_seq_len()) return {o.docs.fixed_seq_len()};  // --docs L1,L2,...: S is their sum
  std::vector<std::int64_t> s;
  for (std::int64_t n = o.begin; n > 0; n = next(n)) s.push_back(n);
  return s;
}

/// --backend local --allgather-kv: --ranks P threads. @returns the exit status.
template <class O, class Next, class Alternate>
int run_local(const O& o, Next&& next, Alternate&& alternate) {
  const ElementType type = o.type_given ? o.type : ElementType::bfloat16;
  const std::int64_t Dv = o.shape.v_head_dim ? o.shape.v_head_dim : o.shape.head_dim;
  std::vector<Line> lines;
  LocalGroup group(o.ranks);
  group.spawn([&](LocalGroup::Comm& comm) {
    std::vector<Line> mine = run_private(comm, sizes_of(o, next), o.docs, o.batch, o.shape.num_kv_heads, o.shape.head_dim, Dv, type, o.path, o.check, alternate);
    if (comm.rank() == 0) lines = std::move(mine);
  });
  return print(lines, "LocalGroup::Comm", o.model, o.shape.num_kv_heads, o.shape.head_dim, Dv, type, o.batch, o.ranks, o.iters, o.warmup, o.check, false);
}

#if ULYSSES_PERF_MPI
/// --backend mpi|window --allgather-kv over `comm`: MpiWindowComm when `window`, else MpiComm.
/// Collective. @returns the exit status (rank 0's table; 1 when a byte was wrong).
template <class O, class Next, class Alternate>
int run_mpi(MpiComm& comm, const O& o, bool window, Next&& next, Alternate&& alternate) {
  const ElementType type = o.type_given ? o.type : ElementType::bfloat16;
  const std::int64_t Dv = o.shape.v_head_dim ? o.shape.v_head_dim : o.shape.head_dim;
  const std::vector<std::int64_t> sizes = sizes_of(o, next);
  const std::vector<Line> lines = window ? run_window(comm, sizes, o.docs, o.batch, o.shape.num_kv_heads, o.shape.head_dim, Dv, type, o.path, o.check, alternate)
                                         : run_private(comm, sizes, o.docs, o.batch, o.shape.num_kv_heads, o.shape.head_dim, Dv, type, o.path, o.check, alternate);
  int rc = 0;
  if (comm.rank() == 0)
    rc = print(lines, window ? "MpiWindowComm" : "MpiComm", o.model, o.shape.num_kv_heads, o.shape.head_dim, Dv, type, o.batch, comm.size(), o.iters,
               o.warmup, o.check, window);
  MPI_Bcast(&rc, 1, MPI_INT, 0, comm.get());
  return rc;
}
#endif

}  // namespace perf_allgather
