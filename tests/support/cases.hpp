// SPDX-License-Identifier: Apache-2.0
// The fault cases of the project's shared case list (C1–C9, C11, C17) and the models sweep, written once
// and run on every backend (in-process group, MPI, CUDA). Each returns the cases for group size P.
#pragma once

#include "harness.hpp"

namespace ut {

inline const Format kFormats[] = {Format::bshd, Format::sbhd, Format::bhsd};

/// C1: B=2, S=4, P=2, H=4, D=1 in each layout (a split along the wrong dimension passes when B=1).
inline std::vector<Case> c1_cases() {
  std::vector<Case> v;
  for (Format f : kFormats)
    v.push_back({std::string("C1 ") + to_string(f), 2, 2, SeqPartition::even(4, 2), {{HeadPartition::even(4, 2), 1}}, f});
  return v;
}

/// C2: B in {1,2}, layouts bshd/sbhd/bhsd, one tensor and q/k/v (GQA) in one exchange, group size P.
inline std::vector<Case> c2_cases(int P) {
  std::vector<Case> v;
  for (std::int64_t B : {1, 2})
    for (Format f : kFormats) {
      const std::string n = "C2 P=" + std::to_string(P) + " B=" + std::to_string(B) + " " + to_string(f);
      auto q = HeadPartition::even(8, P);
      v.push_back({n, P, B, SeqPartition::even(2 * P, P), {{q, 4}}, f});
      v.push_back({n + " qkv", P, B, SeqPartition::even(2 * P, P),
                   {{q, 4}, {HeadPartition::gqa(q, 2), 4}, {HeadPartition::gqa(q, 2), 4}}, f});
    }
  return v;
}

/// C3: S=7 over P=2 balanced (4 and 3 tokens), B=2, H=4, D=8.
inline std::vector<Case> c3_cases() {
  std::vector<Case> v;
  for (Format f : kFormats)
    v.push_back({std::string("C3 ") + to_string(f), 2, 2, SeqPartition::balanced(7, 2), {{HeadPartition::even(4, 2), 8}}, f});
  return v;
}

/// C4: H=7 over P=4 ([2,2,2,1]) and H=20 over P=8 ([3,3,3,3,2,2,2,2]), bshd and sbhd.
inline std::vector<Case> c4_cases(int P) {
  std::vector<Case> v;
  const std::int64_t H = P == 4 ? 7 : 20;
  for (Format f : {Format::bshd, Format::sbhd})
    v.push_back({"C4 H=" + std::to_string(H) + " " + to_string(f), P, 2, SeqPartition::even(2 * P, P),
                 {{HeadPartition::balanced(H, P), 3}}, f});
  return v;
}

/// C5: H=16, Hkv=2, P=4, B=1, S=16, D=8: q, k, v in one exchange, kv head r/2 on rank r.
inline Case c5_case() {
  auto q = HeadPartition::even(16, 4);
  auto kv = HeadPartition::gqa(q, 2);
  return {"C5", 4, 1, SeqPartition::even(16, 4), {{q, 8}, {kv, 8}, {kv, 8}}, Format::bshd};
}

/// C6: empty chunks at P=4: a rank with no tokens (lengths [5,0,3,4]) and a rank with no heads
/// (H=3 balanced: [1,1,1,0]), separately and together, with q/k/v.
inline std::vector<Case> c6_cases() {
  auto h3 = HeadPartition::balanced(3, 4);
  auto seq0 = SeqPartition::lengths(12, 4, {5, 0, 3, 4});
  return {
      {"C6 zero tokens", 4, 2, seq0, {{HeadPartition::even(4, 4), 4}}, Format::bshd},
      {"C6 zero heads", 4, 2, SeqPartition::even(8, 4), {{h3, 4}}, Format::sbhd},
      {"C6 both, qkv", 4, 1, seq0, {{h3, 4}, {HeadPartition::gqa(h3, 1), 4}, {HeadPartition::gqa(h3, 1), 2}}, Format::bhsd},
  };
}

/// C17: a rank with no tokens on the window path: B=2, H=4, Hkv=2, D=1024 (fp32: rows of 4 KiB),
/// q, k, v in one exchange, the last rank empty: lengths {2, 0} at P=2, {2, 2, 2, 0} at P=4.
inline Case c17_case(int P) {
  std::vector<std::int64_t> len(static_cast<std::size_t>(P), 2);
  len.back() = 0;
  const auto q = HeadPartition::even(4, P);
  const auto kv = HeadPartition::gqa(q, 2);
  return {"C17 P=" + std::to_string(P), P, 2, SeqPartition::lengths(len), {{q, 1024}, {kv, 1024}, {kv, 1024}}, Format::bshd};
}

/// C8: B=2, S=8, P=2: the gathered sequence must be in (B, P, S_local) order, not (P, B, S_local).
inline std::vector<Case> c8_cases() {
  std::vector<Case> v;
  for (Format f : kFormats)
    v.push_back({std::string("C8 ") + to_string(f), 2, 2, SeqPartition::even(8, 2), {{HeadPartition::even(2, 2), 2}}, f});
  return v;
}

/// Zigzag (dual-chunk) sequence partitions: rank r holds chunks r and 2P-1-r.
inline std::vector<Case> zigzag_cases(int P) {
  auto q = HeadPartition::balanced(6, P);
  return {{"zigzag P=" + std::to_string(P), P, 2, SeqPartition::zigzag(4 * P + 1, P),
           {{q, 4}, {HeadPartition::gqa(q, 3), 4}}, Format::sbhd}};
}

/// The node layouts the two-level exchange is tested on for group size P: equal nodes where P
/// allows (8 = 2 x 4, 6 = 3 x 2, 4 = 2 x 2), uneven nodes ([P/2 + 1, rest], and 1-rank nodes),
/// and ranks of a node not numbered contiguously.
inline std::vector<std::pair<std::string, ulysses::NodeLayout>> node_layouts(int P) {
  using ulysses::NodeLayout;
  std::vector<std::pair<std::string, NodeLayout>> v;
  if (P % 4 == 0 && P > 4) v.push_back({std::to_string(P / 4) + "x4", NodeLayout::uniform(P, 4)});
  if (P % 2 == 0) v.push_back({std::to_string(P / 2) + "x2", NodeLayout::uniform(P, 2)});
  if (P >= 3) v.push_back({"uneven", NodeLayout::sizes({P / 2 + 1, P - P / 2 - 1})});
  if (P >= 3) v.push_back({"1-rank nodes", NodeLayout::sizes({1, P - 2, 1})});
  std::vector<int> ids;  // node of rank r: r % 2 for the first ranks, a third node for the last
  for (int r = 0; r < P; ++r) ids.push_back(r >= P - 1 && P >= 3 ? 7 : r % 2);
  if (P >= 2) v.push_back({"interleaved", NodeLayout::of(ids)});
  return v;
}

/// The two-level exchange on every node layout of node_layouts(P): GQA q/k/v with kv heads on
/// several ranks (summed in head→seq), uneven sequence and head splits, zigzag, B = 2, K = 2
/// stages (plain and pipelined), all through PlanOptions::path = `path` and PlanOptions::nodes,
/// with one inter-node message per node pair (lanes 1), rail-aligned lanes (0) and 2 lanes.
inline std::vector<Case> two_level_cases(int P, ulysses::Path path) {
  std::vector<Case> v;
  for (const auto& [name, nodes] : node_layouts(P)) {
    const std::string n = "two-level P=" + std::to_string(P) + " " + name + " " + nodes.str();
    auto q = HeadPartition::balanced(2 * P, P);
    auto kv = HeadPartition::gqa(q, 2);  // each kv head on about P/2 ranks
    auto qb = HeadPartition::balanced(P + 3, P);
    std::vector<Case> here = {
        {n + " qkv GQA", P, 2, SeqPartition::even(2 * P, P), {{q, 4}, {kv, 4}, {kv, 2}}, Format::bshd},
        {n + " uneven S and H", P, 1, SeqPartition::balanced(3 * P + 1, P), {{qb, 3}, {HeadPartition::gqa(qb, 1), 3}}, Format::sbhd},
        {n + " zigzag", P, 2, SeqPartition::zigzag(4 * P + 2, P), {{q, 2}}, Format::bhsd},
        {n + " K=2", P, 2, SeqPartition::even(2 * P, P), {{q, 4}, {kv, 4}}, Format::bshd, 2},
        {n + " K=2 pipelined", P, 1, SeqPartition::even(2 * P, P), {{q, 4}, {kv, 4}}, Format::bshd, 2, true},
    };
    for (Case& c : here)
      for (int lanes : {1, 0, 2}) {
        c.path = path;
        c.nodes = nodes;
        c.lanes = lanes;
        v.push_back(c);
        v.back().name += " lanes=" + std::to_string(lanes);
      }
  }
  return v;
}

/// C7: the seq-sharded input of every rank is the view x[:, 4:12] of a [B=2, 16, H=2, D=4] bshd
/// buffer (8 local tokens, not contiguous since B=2); the result of head→seq goes into the same
/// view of another such buffer. Checks the values and that no byte outside the views changes.
template <class T, class Comm>
std::string run_view_case(Comm& comm, int P) {
  using namespace ulysses;
  const int r = comm.rank();
  const std::int64_t B = 2, X = 16, H = 2, D = 4, L = 8, S = L * P;
  const Layout view = Layout::strided({B, L, H, D}, {X * H * D, H * D, D, 1});
  const std::int64_t base = 4 * H * D;  // element offset of x[0, 4]
  auto hp = HeadPartition::even(H, P);
  Plan plan({P, r}, B, SeqPartition::even(S, P),
            {TensorSpec::of<T>(hp, D).with_seq_layout(view)});
  std::vector<T> x(static_cast<std::size_t>(B * X * H * D), sentinel<T>()), y = x;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t s = 0; s < L; ++s)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t d = 0; d < D; ++d)
          x[static_cast<std::size_t>(base + view.offset(b, s, h, d))] = value<T>(position(0, b, r * L + s, h, d, S, H, D, B));
  std::vector<T> mid(static_cast<std::size_t>(plan.head_layout(0).span_elems()));
  std::vector<std::byte> ws(plan.workspace_bytes());
  HostExecutor ex;
  const std::size_t view_bytes = (x.size() - static_cast<std::size_t>(base)) * sizeof(T);
  seq_to_head(plan, comm, ex, ConstByteSpan{x.data() + base, view_bytes}, mid, ws);
  const Layout& hl = plan.head_layout(0);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t s = 0; s < S; ++s)
      for (std::int64_t h = 0; h < hl.extent[2]; ++h)
        for (std::int64_t d = 0; d < D; ++d)
          if (!same_bits(mid[static_cast<std::size_t>(hl.offset(b, s, h, d))],
                         value<T>(position(0, b, s, hp.begin(r) + h, d, S, H, D, B))))
            return "C7 rank " + std::to_string(r) + ": seq_to_head wrong at b=" + std::to_string(b) + " s=" + std::to_string(s);
  head_to_seq(plan, comm, ex, mid, ByteSpan{y.data() + base, view_bytes}, ws);
  if (std::memcmp(x.data(), y.data(), x.size() * sizeof(T)) != 0)
    return "C7 rank " + std::to_string(r) + ": head_to_seq into the view differs from the input view (or wrote outside it)";
  return "";
}

/// C9's other head splits of 3 heads over 2 ranks (rank 0 plans {0,2}, {2,3}; rank 1 one of these).
inline std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>> c9_splits() {
  return {{{0, 1}, {1, 3}}, {{0, 0}, {0, 3}}, {{0, 3}, {3, 3}}};
}

/// C9 on a group of 2 (comm): rank 1 planned `split` of tensor 0's heads, rank 0 {0,2}, {2,3};
/// the exchange (on `path`, default options otherwise) must throw plan_mismatch naming rank 1's
/// head partition on every rank and leave the output untouched. "" or what went wrong.
template <class Comm>
std::string run_c9_case(Comm& comm, const std::vector<std::pair<std::int64_t, std::int64_t>>& split, ulysses::Path path) {
  using namespace ulysses;
  const int r = comm.rank();
  const auto heads = r == 0 ? HeadPartition::ranges(3, {{0, 2}, {2, 3}}) : HeadPartition::ranges(3, split);
  PlanOptions po;
  po.path = path;
  Plan plan({2, r}, 1, SeqPartition::even(4, 2), {TensorSpec::of<float>(heads, 2)}, Format::bshd, po);
  if (!plan.agreement_check_enabled()) return "C9: the agreement check is off by default";
  std::vector<float> in(plan.seq_bytes(0) / 4, 1.f), out(plan.head_bytes(0) / 4, -7.f);
  std::vector<std::byte> ws(plan.workspace_bytes());
  HostExecutor ex;
  std::string msg;
  Errc code{};
  try {
    seq_to_head(plan, comm, ex, in, out, ws);
  } catch (const Error& e) {
    code = e.code(), msg = e.what();
  }
  if (code != Errc::plan_mismatch) return "C9 rank " + std::to_string(r) + ": not plan_mismatch: " + (msg.empty() ? "no error" : msg);
  if (msg.find("rank 1 differs from rank 0 in the head partition of tensor 0") == std::string::npos) return "C9 rank " + std::to_string(r) + ": " + msg;
  for (float v : out)
    if (v != -7.f) return "C9 rank " + std::to_string(r) + ": the output was written";
  return "";
}

/// C11 on a group of 4 (comm): MQA (4 query heads, 1 kv head, D = 2, S = 8), rank r's partial
/// gradient of the kv head is (r+1) * code(s, d); seq_to_head_backward on `path` must give every
/// rank the sum over ranks, 10 * code, bit for bit (fp32). "" or the first wrong element.
template <class Comm>
std::string run_c11_case(Comm& comm, ulysses::Path path) {
  using namespace ulysses;
  const int P = 4, r = comm.rank();
  const auto a = attention_specs<float>(P, {4, 1, 2});
  PlanOptions po;
  po.path = path;
  Plan plan({P, r}, 1, SeqPartition::even(8, P), a.qkv(), Format::bshd, po);
  std::vector<float> dq2(plan.head_bytes(0) / 4), dk2(plan.head_bytes(1) / 4), dv2(plan.head_bytes(2) / 4);
  for (std::size_t i = 0; i < dk2.size(); ++i) dk2[i] = static_cast<float>(r + 1) * static_cast<float>(i + 1);  // (r+1)*code(s, d)
  std::vector<float> dq(plan.seq_bytes(0) / 4), dk(plan.seq_bytes(1) / 4), dv(plan.seq_bytes(2) / 4);
  std::vector<std::byte> ws(plan.workspace_bytes());
  HostExecutor ex;
  seq_to_head_backward(plan, comm, ex, {dq2, dk2, dv2}, {dq, dk, dv}, ws);
  for (std::size_t i = 0; i < dk.size(); ++i)
    if (dk[i] != 10.f * static_cast<float>(2 * 2 * r + static_cast<int>(i) + 1))
      return "C11 rank " + std::to_string(r) + ": dk[" + std::to_string(i) + "] = " + std::to_string(dk[i]);
  return "";
}

}  // namespace ut

#include "models.hpp"

namespace ut {

/// The error planning must raise for `m` at group size P with even head splits, or Errc{} (0) when
/// planning must succeed: H % P != 0 → heads_not_divisible; then neither Hkv % P nor P % Hkv → gqa_group_mismatch.
inline ulysses::Errc expected_even_error(const ulysses_models::Model& m, int P) {
  if (m.num_heads % P != 0) return ulysses::Errc::heads_not_divisible;
  if (m.num_kv_heads % P != 0 && P % m.num_kv_heads != 0) return ulysses::Errc::gqa_group_mismatch;
  return ulysses::Errc{};
}

/// q, k, v of model m at group size P with a scaled-down sequence of S = 3P - 1 tokens (uneven,
/// balanced), B=1; heads split evenly when `even`, else balanced; v uses v_head_dim (MLA).
inline Case model_case(const ulysses_models::Model& m, int P, bool even) {
  auto q = even ? HeadPartition::even(m.num_heads, P) : HeadPartition::balanced(m.num_heads, P);
  auto kv = HeadPartition::gqa(q, m.num_kv_heads);
  return {std::string(m.name) + " P=" + std::to_string(P) + (even ? " even" : " balanced"), P, 1,
          SeqPartition::balanced(3 * P - 1, P), {{q, m.head_dim}, {kv, m.head_dim}, {kv, m.v_head_dim}}, Format::bshd};
}

}  // namespace ut
