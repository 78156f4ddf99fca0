// SPDX-License-Identifier: Apache-2.0
// allgather.hpp under mpiexec (-n 4, 6, 8): all-gather KV across real processes, over MpiComm
// (Path::messages, Path::alltoallv) and over MpiWindowComm (Path::direct, the peer copy: inputs
// and outputs in the window, inputs in it and outputs outside, inputs outside and outputs in it,
// every tensor outside (read in place with Cross Memory Attach where the window's probe allows
// it), every tensor outside and staged):
//  1. allgather_kv(): every rank's k and v, [B, S, Hkv, D] and [B, S, Hkv, Dv], the whole
//     sequence in global order (zigzag, uneven with a rank without tokens, B = 2, Dv != D), float32
//     and a bf16 struct, bit for bit; on the world and on groups of half of it at once;
//  2. case C25 (shared/cases/bug_cases.md): allgather_kv_backward() in float32 in ascending rank
//     order, rounded once: bf16 1.03125 (0x3F84) at every position of dk and dv at P = 8 (the
//     whole world at -n 8); the float32 order probe 1.00000012f at every P; the same bits over 20
//     runs on every transport; a failure on one rank is reported on every rank;
//  3. C25 on a U = 2 x AG = 4 mesh (-n 8, split_by_node()): each rank's k seq->head within its
//     Ulysses group of 2, then allgather_kv() over its all-gather group of 4 (the outer group:
//     the ring's role), the whole sequence of its kv heads bit for bit; then dk reduce-scattered
//     over the all-gather group: 0x3F84 (bf16: AG ranks 1.0, 2^-8, 2^-8, 5 * 2^-8, the same
//     exact sum 1.02734375 as C25's eight) and 1.00000012f (AG rank 2 1.0f, AG ranks 0 and 1
//     2^-24), 20 runs, every transport; then head->seq within the Ulysses group, bits unchanged.
#include "mpi_groups.hpp"
#include "mpi_vias.hpp"

#include <ulysses/comm/mpi.hpp>
#include <ulysses/comm/mpi_mesh.hpp>
#include <ulysses/ulysses.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

using namespace ulysses;

namespace {
struct bf16 {
  std::uint16_t bits;
};
}  // namespace
template <>
struct ulysses::element_type_of<bf16> : std::integral_constant<ElementType, ElementType::bfloat16> {};

namespace {

/// The element of (tensor t, b, global token s, head h, d): float32 a distinct exact value, bf16
/// distinct finite bits (positive normals) from the same position.
template <class T>
T element(int t, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d);
template <>
float element<float>(int t, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) {
  return static_cast<float>((((t * 4 + b) * 1000 + s) * 16 + h) * 64 + d) * 0.25f;
}
template <>
bf16 element<bf16>(int t, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) {
  std::uint64_t x = static_cast<std::uint64_t>((((t * 4 + b) * 1000 + s) * 16 + h) * 64 + d + 1) * 0x9e3779b97f4a7c15ull;
  x ^= x >> 29;
  return bf16{static_cast<std::uint16_t>(0x0080 + (x >> 40) % 0x7e00)};  // exponent 1 .. 252: finite, normal
}
template <class T>
std::uint32_t bits_of(const T& x) {
  std::uint32_t u = 0;
  std::memcpy(&u, &x, sizeof(T));
  return u;
}
std::string hex(std::uint32_t u) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%x", u);
  return buf;
}
template <class T>
const char* type_name() {
  return std::is_same_v<T, float> ? "float32" : "bfloat16";
}

// The communicators and where the tensors lie: tests/support/mpi_vias.hpp (this test runs the
// first seven ways).
using ut::Comms;
using ut::inputs_in;
using ut::name_of;
using ut::on_window;
using ut::outputs_in;
using ut::Store;
using ut::Via;
constexpr Via kVias[] = {Via::messages, Via::alltoallv, Via::window, Via::inputs_in_window, Via::outputs_in_window, Via::outside, Via::staged};

/// Runs `call(comm, path)` the way `via` says (ut::run_via()); then what the window communicator
/// says of its copies. Returns this rank's error ("" when none).
template <class F>
std::string run_via(Comms& g, Via via, bool reads_peers, F&& call) {
  const std::string e = ut::run_via(g, via, call);
  if (!e.empty() || !on_window(via)) return e;
  const MpiWindowComm& wc = g.wc;
  if (wc.outputs_in_window() != outputs_in(via)) return "outputs_in_window() is " + std::to_string(wc.outputs_in_window());
  if (inputs_in(via) && wc.staged_bytes() + wc.remote_bytes() != 0) return "inputs in the window were staged or read remotely";
  if (via == Via::staged && wc.remote_bytes() != 0) return "staged inputs were read with Cross Memory Attach";
  if (via == Via::outside && wc.cross_memory_attach() && wc.staged_bytes() != 0) return "inputs outside the window were staged with Cross Memory Attach on";
  if (via == Via::outside && wc.cross_memory_attach() && reads_peers && wc.remote_bytes() == 0) return "nothing was read with Cross Memory Attach";
  return "";
}

/// Every rank's message of the group, "" on every rank when all are "" (so that a failure on one
/// rank fails the check on every rank, with the failing ranks named). Collective over `sub`.
std::string every_rank(MPI_Comm sub, const std::string& mine) {
  int n = 0, r = 0;
  MPI_Comm_size(sub, &n);
  MPI_Comm_rank(sub, &r);
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(static_cast<std::size_t>(n)), offs(static_cast<std::size_t>(n));
  MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, sub);
  int total = 0;
  for (int p = 0; p < n; ++p) offs[static_cast<std::size_t>(p)] = total, total += lens[static_cast<std::size_t>(p)];
  std::vector<char> all(static_cast<std::size_t>(total) + 1);
  MPI_Allgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), offs.data(), MPI_CHAR, sub);
  std::string out;
  for (int p = 0; p < n; ++p)
    if (lens[static_cast<std::size_t>(p)])
      out += "rank " + std::to_string(p) + ": " + std::string(all.data() + offs[static_cast<std::size_t>(p)], static_cast<std::size_t>(lens[static_cast<std::size_t>(p)])) + "; ";
  return out;
}

// ---- 1. the gather ------------------------------------------------------------------------------

/// allgather_kv() of k (Hkv heads of D) and v (Dv) of type T on this rank of g with `seq`, then
/// every element of this rank's whole k and v against element<T>(). "" when every bit matches.
template <class T>
std::string run_gather(Comms& g, const SeqPartition& seq, std::int64_t B, std::int64_t Hkv, std::int64_t D, std::int64_t Dv, Via via) {
  const int P = g.size(), r = g.rank();
  const std::int64_t S = seq.seq_len(), dims[2] = {D, Dv};
  Store store(g);
  HostExecutor ex(r % 2 ? 2 : 1);  // one rank on two threads
  // (the peers read this rank's seq-sharded inputs where it has tokens)
  return run_via(g, via, P > 1 && seq.local_length(r) > 0, [&](auto& comm, Path path) {
    PlanOptions opt;
    opt.path = path;
    const Plan plan({P, r}, B, seq, allgather_kv_specs<T>(P, Hkv, D, Dv).kv(), Format::bshd, opt);
    TensorList<ConstByteSpan> ins;
    TensorList<ByteSpan> outs;
    T* o[2];
    for (int t = 0; t < 2; ++t) {
      const Layout& sl = plan.seq_layout(t);
      const auto n = static_cast<std::size_t>(sl.span_elems());
      T* x = store.take<T>(n, inputs_in(via));
      for (std::size_t i = 0; i < n; ++i) x[i] = T{};
      for (const SeqChunk& c : seq.chunks_of(r))
        for (std::int64_t b = 0; b < B; ++b)
          for (std::int64_t i = 0; i < c.length; ++i)
            for (std::int64_t h = 0; h < Hkv; ++h)
              for (std::int64_t d = 0; d < dims[t]; ++d)
                x[static_cast<std::size_t>(sl.offset(b, c.local_offset + i, h, d))] = element<T>(t, b, c.offset + i, h, d);
      ins.push_back(ConstByteSpan(reinterpret_cast<const std::byte*>(x), n * sizeof(T)));
      const auto m = static_cast<std::size_t>(plan.head_layout(t).span_elems());
      o[t] = store.take<T>(m, outputs_in(via));
      std::memset(static_cast<void*>(o[t]), 0xff, m * sizeof(T));
      outs.push_back(ByteSpan(reinterpret_cast<std::byte*>(o[t]), m * sizeof(T)));
    }
    std::vector<std::byte> ws(plan.workspace_bytes());
    allgather_kv(plan, comm, ex, ins, outs, ws);
    for (int t = 0; t < 2; ++t) {
      const Layout& hl = plan.head_layout(t);
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t s = 0; s < S; ++s)
          for (std::int64_t h = 0; h < Hkv; ++h)
            for (std::int64_t d = 0; d < dims[t]; ++d) {
              const T got = o[t][static_cast<std::size_t>(hl.offset(b, s, h, d))], want = element<T>(t, b, s, h, d);
              if (bits_of(got) != bits_of(want))
                throw std::runtime_error(std::string(t ? "v" : "k") + " at b=" + std::to_string(b) + " token=" + std::to_string(s) + " h=" +
                                         std::to_string(h) + " d=" + std::to_string(d) + ": got " + hex(bits_of(got)) + ", want " + hex(bits_of(want)));
            }
    }
  });
}

/// The splits of the gather at group size P: zigzag (S = 4P + 2: chunks of two lengths), uneven
/// with rank 1 empty, and even.
std::vector<std::pair<std::string, SeqPartition>> gather_splits(int P) {
  std::vector<std::int64_t> len;
  for (int p = 0; p < P; ++p) len.push_back(p == 1 ? 0 : 3 + p);
  return {{"zigzag", SeqPartition::zigzag(4 * P + 2, P)}, {"uneven, rank 1 without tokens", SeqPartition::lengths(len)},
          {"even", SeqPartition::even(2 * P, P)}};
}

}  // namespace

TEST_CASE("allgather_kv: every rank gets the whole k and v in global order, bit for bit (zigzag, uneven, an empty rank, B = 2, Dv != D; float32 and bf16), every communicator") {
  const int W = ut::world_size();
  int told = 0;
  for (int P : {W, W / 2})
    ut::on_groups_of(P, [&](MPI_Comm sub) {
      Comms g(sub);
      int wr = 0;
      MPI_Comm_rank(MPI_COMM_WORLD, &wr);
      if (wr == 0 && !told++) {
        const std::string how = g.win.cross_memory_attach() ? "Cross Memory Attach between the ranks: permitted"
                                                            : "Cross Memory Attach between the ranks: not permitted (staging)";
        MESSAGE(how);
      }
      for (const auto& [name, seq] : gather_splits(P))
        for (std::int64_t B : {1, 2})
          for (Via via : kVias) {
            CAPTURE(P);
            CAPTURE(name);
            CAPTURE(B);
            CAPTURE(std::string(name_of(via)));
            CHECK(every_rank(sub, run_gather<float>(g, seq, B, 2, 8, 4, via)) == "");
            CHECK(every_rank(sub, run_gather<bf16>(g, seq, B, 3, 6, 10, via)) == "");
            CHECK(every_rank(sub, run_gather<bf16>(g, seq, B, 1, 4, 4, via)) == "");  // MQA-like: one kv head, Dv = D
          }
    });
}

// ---- 2. C25 -------------------------------------------------------------------------------------

namespace {

/// The C25 backward on this rank of g: dk, dv [B, S, Hkv, D] of type T, every element of this
/// rank's copy grad(rank); allgather_kv_backward() over `via`; every element of this rank's dk
/// and dv must have the bits `want`. "" when they all do.
template <class T, class G>
std::string run_reduce_scatter(Comms& g, const SeqPartition& seq, Via via, G grad, std::uint32_t want) {
  const int P = g.size(), r = g.rank();
  const std::int64_t B = 1, Hkv = 2, D = 4;
  Store store(g);
  HostExecutor ex;
  std::string bad;
  bool peers_have_tokens = false;  // (they read this rank's head-side inputs)
  for (int p = 0; p < P; ++p) peers_have_tokens = peers_have_tokens || (p != r && seq.local_length(p) > 0);
  std::string err = run_via(g, via, peers_have_tokens, [&](auto& comm, Path path) {
    PlanOptions opt;
    opt.path = path;
    const Plan plan({P, r}, B, seq, allgather_kv_specs<T>(P, Hkv, D).kv(), Format::bshd, opt);
    TensorList<ConstByteSpan> ins;
    TensorList<ByteSpan> outs;
    T* o[2];
    std::size_t m[2];
    for (int t = 0; t < 2; ++t) {
      const auto n = static_cast<std::size_t>(plan.head_layout(t).span_elems());
      T* x = store.take<T>(n, inputs_in(via));
      for (std::size_t i = 0; i < n; ++i) x[i] = grad(r);
      ins.push_back(ConstByteSpan(reinterpret_cast<const std::byte*>(x), n * sizeof(T)));
      m[t] = static_cast<std::size_t>(plan.seq_layout(t).span_elems());
      o[t] = store.take<T>(m[t], outputs_in(via));
      std::memset(static_cast<void*>(o[t]), 0xff, m[t] * sizeof(T));
      outs.push_back(ByteSpan(reinterpret_cast<std::byte*>(o[t]), m[t] * sizeof(T)));
    }
    std::vector<std::byte> ws(plan.workspace_bytes());
    allgather_kv_backward(plan, comm, ex, ins, outs, ws);
    for (int t = 0; t < 2; ++t)
      for (std::size_t i = 0; i < m[t] && bad.empty(); ++i)
        if (bits_of(o[t][i]) != want)
          bad = std::string(t ? "dv" : "dk") + " element " + std::to_string(i) + " is " + hex(bits_of(o[t][i])) + ", want " + hex(want);
  });
  return err.empty() ? bad : err;
}

const bf16 kOne{0x3F80}, kEighth{0x3B80};  // bf16 1.0, 2^-8
constexpr std::uint32_t kC25Bf16 = 0x3F84;  // bf16 1.03125

std::uint32_t probe_bits() {
  const float want = 1.00000012f;  // (2^-24 + 2^-24) + 1, rounded once
  std::uint32_t u = 0;
  std::memcpy(&u, &want, 4);
  return u;
}

}  // namespace

TEST_CASE("C25 at P = 8 (the whole world at -n 8): bf16 dk|dv reduce-scattered in float32, rounded once: 0x3F84 at every position, 20 runs, every communicator") {
  const int W = ut::world_size();
  if (W != 8) {
    MESSAGE("C25's bf16 case needs the whole world at -n 8: skipped at -n " << W);
    return;
  }
  auto grad = [](int r) { return r == 0 ? kOne : kEighth; };  // the exact sum 1.02734375
  ut::on_groups_of(8, [&](MPI_Comm sub) {
    Comms g(sub);
    for (Via via : kVias)
      for (const SeqPartition& seq : {SeqPartition::zigzag(32, 8), SeqPartition::even(16, 8)})
        for (int run = 0; run < 20; ++run) {
          CAPTURE(std::string(name_of(via)));
          CAPTURE(seq.seq_len());
          CAPTURE(run);
          CHECK(every_rank(sub, run_reduce_scatter<bf16>(g, seq, via, grad, kC25Bf16)) == "");
        }
  });
}

TEST_CASE("C25 order probe at every P: rank 2 gives 1.0f, ranks 0 and 1 2^-24: 1.00000012f (never 1.0f), 20 runs, every communicator") {
  auto grad = [](int r) { return r == 2 ? 1.0f : r < 2 ? 0x1p-24f : 0.0f; };
  const int W = ut::world_size();
  for (int P : {W, W / 2})
    ut::on_groups_of(P, [&](MPI_Comm sub) {
      Comms g(sub);
      if (P < 3) return;  // (rank 2 is the probe's)
      for (Via via : kVias)
        for (int run = 0; run < 20; ++run) {
          CAPTURE(P);
          CAPTURE(std::string(name_of(via)));
          CAPTURE(run);
          CHECK(every_rank(sub, run_reduce_scatter<float>(g, SeqPartition::zigzag(4 * P, P), via, grad, probe_bits())) == "");
        }
    });
}

// ---- 3. C25 on a U = 2 x AG = 4 mesh --------------------------------------------------------------

namespace {

/// One step of the U x AG layer on this rank: k (Hkv heads of D, type T) of the whole sequence S
/// split zigzag over the AG group of 4, each AG rank's tokens split even over its Ulysses group
/// of 2; seq->head of k within the Ulysses group (MpiComm); allgather_kv() over the AG group on
/// `via` (this Ulysses rank's kv heads, the whole sequence, against element<T>()); dk of the whole
/// sequence, every element grad(AG rank), reduce-scattered over the AG group on `via`: every
/// element `want`; then head->seq within the Ulysses group: still `want`. "" when all held.
template <class T, class G>
std::string run_mesh(MpiComm& ucomm, Comms& ag, Via via, G grad, std::uint32_t want) {
  const int U = ucomm.size(), u = ucomm.rank(), A = ag.size(), a = ag.rank();
  const std::int64_t S = 8 * A, Hkv = 4, D = 4, B = 1;
  const SeqPartition ag_seq = SeqPartition::zigzag(S, A);       // the AG group's split of the sequence
  const SeqPartition u_seq = SeqPartition::even(ag_seq.local_length(a), U);  // this AG rank's tokens over its Ulysses group
  const HeadPartition heads = HeadPartition::even(Hkv, U);
  const std::int64_t Hu = heads.end(u) - heads.begin(u);
  HostExecutor ex;
  // seq->head of k within the Ulysses group: [B, S_u, Hkv, D] -> [B, S_a, Hu, D].
  const Plan uplan({U, u}, B, u_seq, {TensorSpec::of<T>(heads, D)}, Format::bshd);
  std::vector<T> k_u(uplan.seq_bytes(0) / sizeof(T)), k_a(uplan.head_bytes(0) / sizeof(T));
  for (std::int64_t i = 0; i < u_seq.local_length(u); ++i)
    for (std::int64_t h = 0; h < Hkv; ++h)
      for (std::int64_t d = 0; d < D; ++d)
        k_u[static_cast<std::size_t>(uplan.seq_layout(0).offset(0, i, h, d))] =
            element<T>(0, 0, ag_seq.global_token(a, u_seq.global_token(u, i)), h, d);
  std::vector<std::byte> uws(uplan.workspace_bytes());
  try {
    seq_to_head(uplan, ucomm, ex, {ConstByteSpan(k_u)}, {ByteSpan(k_a)}, uws);
  } catch (const std::exception& e) {
    return std::string("seq->head threw: ") + e.what();
  }
  // All-gather over the AG group: [B, S_a, Hu, D] (k_a's layout is bshd: dense) -> [B, S, Hu, D].
  std::string bad;
  std::vector<T> dk_a(k_a.size());
  Store store(ag);
  std::string err = run_via(ag, via, true, [&](auto& comm, Path path) {
    PlanOptions opt;
    opt.path = path;
    const Plan plan({A, a}, B, ag_seq, allgather_kv_specs<T>(A, Hu, D).kv(), Format::bshd, opt);
    if (plan.seq_bytes(0) != k_a.size() * sizeof(T)) throw std::runtime_error("k after seq->head is not the all-gather's seq-sharded k");
    const std::size_t n = k_a.size(), m = plan.head_bytes(0) / sizeof(T);
    T* kin = store.take<T>(n, inputs_in(via));
    std::memcpy(static_cast<void*>(kin), k_a.data(), n * sizeof(T));
    T* kall = store.take<T>(m, outputs_in(via));
    T* vall = store.take<T>(m, outputs_in(via));
    std::vector<std::byte> ws(plan.workspace_bytes());
    allgather_kv(plan, comm, ex, {ConstByteSpan(reinterpret_cast<const std::byte*>(kin), n * sizeof(T)), ConstByteSpan(reinterpret_cast<const std::byte*>(kin), n * sizeof(T))},
                 {ByteSpan(reinterpret_cast<std::byte*>(kall), m * sizeof(T)), ByteSpan(reinterpret_cast<std::byte*>(vall), m * sizeof(T))}, ws);
    for (std::int64_t s = 0; s < S && bad.empty(); ++s)
      for (std::int64_t h = 0; h < Hu; ++h)
        for (std::int64_t d = 0; d < D; ++d) {
          const std::size_t at = static_cast<std::size_t>(plan.head_layout(0).offset(0, s, h, d));
          const T w = element<T>(0, 0, s, heads.begin(u) + h, d);
          if (bits_of(kall[at]) != bits_of(w) || bits_of(vall[at]) != bits_of(w)) {
            bad = "gathered k|v at token " + std::to_string(s) + " h=" + std::to_string(h) + ": " + hex(bits_of(kall[at])) + ", want " + hex(bits_of(w));
            break;
          }
        }
    // dk|dv of the whole sequence, reduce-scattered over the AG group.
    T* dall = store.take<T>(m, inputs_in(via));
    for (std::size_t i = 0; i < m; ++i) dall[i] = grad(a);
    T* dk = store.take<T>(n, outputs_in(via));
    T* dv = store.take<T>(n, outputs_in(via));
    allgather_kv_backward(plan, comm, ex, {ConstByteSpan(reinterpret_cast<const std::byte*>(dall), m * sizeof(T)), ConstByteSpan(reinterpret_cast<const std::byte*>(dall), m * sizeof(T))},
                          {ByteSpan(reinterpret_cast<std::byte*>(dk), n * sizeof(T)), ByteSpan(reinterpret_cast<std::byte*>(dv), n * sizeof(T))}, ws);
    for (std::size_t i = 0; i < n && bad.empty(); ++i)
      if (bits_of(dk[i]) != want || bits_of(dv[i]) != want) bad = "dk|dv element " + std::to_string(i) + " is " + hex(bits_of(dk[i])) + "|" + hex(bits_of(dv[i])) + ", want " + hex(want);
    std::memcpy(static_cast<void*>(dk_a.data()), dk, n * sizeof(T));
  });
  if (!err.empty()) return err;
  if (!bad.empty()) return bad;
  // head->seq of dk within the Ulysses group (no replicas: a copy): every element still `want`.
  std::vector<T> dk_u(k_u.size());
  try {
    seq_to_head_backward(uplan, ucomm, ex, {ConstByteSpan(dk_a)}, {ByteSpan(dk_u)}, uws);
  } catch (const std::exception& e) {
    return std::string("head->seq threw: ") + e.what();
  }
  for (std::size_t i = 0; i < dk_u.size(); ++i)
    if (bits_of(dk_u[i]) != want) return "dk after head->seq, element " + std::to_string(i) + ": " + hex(bits_of(dk_u[i])) + ", want " + hex(want);
  return "";
}

}  // namespace

TEST_CASE("C25 on a U = 2 x AG = 4 mesh (-n 8): seq->head in the Ulysses group, all-gather over the AG group bit for bit, dk reduce-scattered: 0x3F84 and 1.00000012f, 20 runs, every communicator") {
  const int W = ut::world_size();
  if (W != 8) {
    MESSAGE("the U = 2 x AG = 4 mesh needs -n 8: skipped at -n " << W);
    return;
  }
  MpiMesh mesh = split_by_node(MPI_COMM_WORLD, 2);
  {
    MpiComm ucomm(mesh.ulysses);
    Comms ag(mesh.outer);
    REQUIRE(ucomm.size() == 2);
    REQUIRE(ag.size() == 4);
    // bf16: AG ranks give 1.0, 2^-8, 2^-8, 5 * 2^-8: the exact sum 1.02734375 (C25's), bf16 0x3F84;
    // a bf16 chain from AG rank 0 gives 0x3F82.
    auto bgrad = [](int a) { return a == 0 ? kOne : a == 3 ? bf16{0x3CA0} : kEighth; };
    auto fgrad = [](int a) { return a == 2 ? 1.0f : a < 2 ? 0x1p-24f : 0.0f; };
    for (Via via : kVias)
      for (int run = 0; run < 20; ++run) {
        CAPTURE(std::string(name_of(via)));
        CAPTURE(run);
        CHECK(every_rank(MPI_COMM_WORLD, run_mesh<bf16>(ucomm, ag, via, bgrad, kC25Bf16)) == "");
        CHECK(every_rank(MPI_COMM_WORLD, run_mesh<float>(ucomm, ag, via, fgrad, probe_bits())) == "");
      }
  }
  mesh.free();
}

int main(int argc, char** argv) { return ut::mpi_doctest_main(argc, argv); }
