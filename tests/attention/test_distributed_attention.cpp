// SPDX-License-Identifier: Apache-2.0
// The drop-in distributed attention (attention/distributed.hpp), in-process: plain Ulysses and
// Ulysses × Ring (U × R = 2 × 2, 4 × 1, 1 × 4; GQA and MQA with kv heads replicated on several
// Ulysses ranks; causal zigzag and non-causal; uneven S; B = 2), forward and backward, through the
// example's fp32 kernels (examples/common/ring_attention.hpp): the same bits as the hand-written
// driver it replaced, within 2e-5 of the double-precision reference, the same bits between
// equivalent configurations; bfloat16 (the kernel on widened views) within bf16 rounding of the
// reference; the step the kernel sees; and the errors (communicator sizes, a
// mismatched configuration, a short span or a kernel that throws on one rank: a coded error on
// every rank, no hang).
#include <doctest/doctest.h>

#include <ulysses/attention/distributed.hpp>
#include <ulysses/ulysses.hpp>

#include <atomic>
#include <cmath>
#include <functional>
#include <chrono>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "expect_error.hpp"
#include "ring_attention.hpp"

using namespace ulysses;
namespace rd = ulysses_ring_demo;

namespace {
struct DaCase {
  int U, R;
  std::int64_t S, H, Hkv, B;
  bool causal;
};
/// FNV-1a 64 of the bits of x, continuing h.
std::uint64_t hash_bits(std::uint64_t h, const std::vector<float>& x) {
  for (float f : x) {
    std::uint32_t b;
    std::memcpy(&b, &f, 4);
    for (int i = 0; i < 4; ++i) h = (h ^ ((b >> (8 * i)) & 0xffu)) * 0x100000001b3ull;
  }
  return h;
}
rd::RingCase ring_case(const DaCase& d) {
  rd::RingCase c;
  c.U = d.U, c.R = d.R, c.S = d.S, c.H = d.H, c.Hkv = d.Hkv, c.B = d.B, c.causal = d.causal;
  c.layout = d.causal ? RingLayout::zigzag : RingLayout::contiguous;
  return c;
}
// The cases, and the hashes (out, lse, dq, dk, dv over the ranks in order) that the hand-written
// driver of examples/common/ring_attention.hpp at commit 7000e07 (ring_forward(), ring_backward():
// dq accumulated in place across the steps) gave for them, built with g++ -O3.
const DaCase kCases[] = {{2, 2, 22, 4, 4, 1, true}, {2, 2, 22, 4, 4, 1, false}, {4, 1, 22, 8, 8, 1, true}, {4, 1, 22, 8, 8, 1, false},
                         {1, 4, 22, 4, 2, 1, true}, {1, 4, 22, 4, 2, 1, false}, {4, 1, 22, 8, 2, 1, true}, {2, 2, 22, 4, 1, 2, true},
                         {4, 1, 22, 8, 1, 1, false}, {2, 2, 23, 4, 1, 1, false}};
const std::uint64_t kOld[][5] = {
    {0x0e4bcb216c83c139ull, 0x74e28c336a7ef65eull, 0x31a03440cb3c6e2dull, 0x857d1636692fbf4dull, 0x1960f6b29989427full},
    {0x01cb99592477d2c3ull, 0xbcbd5fdbdd0afbd8ull, 0x1c1f4e1726cefab7ull, 0xb336885484ac4398ull, 0x5e955a4cf40f75deull},
    {0xfadb8b00c5e7a64eull, 0xfdc8fe4b976bb7a5ull, 0xac1459a53fdfda93ull, 0xd99057a640cdb06cull, 0xaf4b9dcab8349c4cull},
    {0xe02da2ba5864b97aull, 0x658b6189f961f05aull, 0xf334f284aa534e8full, 0x68dc59657a9b63d3ull, 0x01bd4b7dabdfcb40ull},
    {0x6ec1d63dcf27d4cbull, 0xea6304c0c279175eull, 0xaccb5e80f37d2a9aull, 0x7031bc98be113850ull, 0x7918ee1782b34639ull},
    {0x03f1936b874d5b63ull, 0xd951952c6f1cc483ull, 0x19f3e690cf929199ull, 0x8658aad8354d94b4ull, 0xe79d88a7f92a4f0bull},
    {0x47db4918d1dabf85ull, 0xe5b5e60bf48e5faaull, 0xeefe2eae0852e4aeull, 0xfcb2b5685c46d583ull, 0xf3765b66f0ef438aull},
    {0xc9c023b01c140c80ull, 0xd059a1fe7d127ceaull, 0x1b49250ecacb49cbull, 0x802b2f6e427e5010ull, 0x05fb59c7b6c6c06dull},
    {0xeefd39202e0169acull, 0x63e151d32ced1f32ull, 0x3aa54e1416222060ull, 0x6ff05e7eb8ffb9dcull, 0x7fb09815ee7780e9ull},
    {0x5d7847dd57bf6cfcull, 0x0f1ba1d538323b60ull, 0x5d6ce23003e99adeull, 0x52aa0bda39c31381ull, 0x333af7f5d23c3b78ull},
};

/// Whether a and b hold the same bits.
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
bool same_bits(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!same_bits(a[i], b[i])) return false;
  return true;
}
/// Checks that two runs of one rank gave the same bits: out, lse, dq, dk, dv.
void check_same_results(const rd::RingRankResult& a, const rd::RingRankResult& b) {
  CHECK(same_bits(a.out, b.out));
  CHECK(same_bits(a.lse, b.lse));
  CHECK(same_bits(a.dq, b.dq));
  CHECK(same_bits(a.dk, b.dk));
  CHECK(same_bits(a.dv, b.dv));
}

/// The global [B, S, Hx, Dx] tensor of every rank's seq shard (seq: the world's partition).
std::vector<float> gather(const SeqPartition& seq, std::int64_t B, std::int64_t Hx, std::int64_t Dx, const std::vector<std::vector<float>>& shards) {
  const std::int64_t S = seq.seq_len(), n = Hx * Dx;
  std::vector<float> g(static_cast<std::size_t>(B * S * n));
  for (int w = 0; w < seq.degree(); ++w) {
    const std::int64_t Sw = seq.local_length(w);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t i = 0; i < Sw; ++i)
        std::memcpy(&g[static_cast<std::size_t>((b * S + seq.global_token(w, i)) * n)], &shards[static_cast<std::size_t>(w)][static_cast<std::size_t>((b * Sw + i) * n)],
                    static_cast<std::size_t>(n) * sizeof(float));
  }
  return g;
}

/// Plain Ulysses through the Ulysses-only overloads over `seq` (P ranks): every rank's out, dq, dk, dv gathered to global tensors.
/// With `bands` > 1 the forward runs over that many head bands (DistributedAttentionOptions::bands), their exchanges
/// progressing as `progress` says (DistributedAttentionOptions::progress).
std::vector<std::vector<float>> plain_ulysses(const rd::RingCase& c, const rd::RingGlobals& g, const SeqPartition& seq, int bands = 1,
                                              Progress progress = Progress::automatic) {
  const int P = c.U;
  std::vector<std::vector<std::vector<float>>> r(4, std::vector<std::vector<float>>(static_cast<std::size_t>(P)));
  LocalGroup group(P, std::chrono::seconds(60));
  group.spawn([&](LocalGroup::Comm& comm) {
    const int w = comm.rank();
    const AttentionSpecs specs = attention_specs<float>(P, {c.H, c.Hkv, c.D, c.Dv});
    DistributedAttentionOptions opt;
    opt.bands = bands;
    opt.progress = progress;
    const DistributedAttentionPlan plan({P, w}, c.B, seq, specs, c.causal, opt);
    CHECK(plan.steps() == 1);
    CHECK(plan.qkv_plan().num_stages() == bands);
    auto shard = [&](const std::vector<float>& x, std::int64_t Hx, std::int64_t Dx) {
      std::vector<float> s(static_cast<std::size_t>(c.B * seq.local_length(w) * Hx * Dx));
      for (std::int64_t b = 0; b < c.B; ++b)
        for (std::int64_t i = 0; i < seq.local_length(w); ++i)
          std::memcpy(&s[static_cast<std::size_t>((b * seq.local_length(w) + i) * Hx * Dx)], &x[static_cast<std::size_t>((b * c.S + seq.global_token(w, i)) * Hx * Dx)],
                      static_cast<std::size_t>(Hx * Dx) * sizeof(float));
      return s;
    };
    const std::vector<float> q = shard(g.q, c.H, c.D), k = shard(g.k, c.Hkv, c.D), v = shard(g.v, c.Hkv, c.Dv), dos = shard(g.dout, c.H, c.Dv);
    std::vector<float> o(dos.size()), dq(q.size()), dk(k.size()), dv(v.size());
    std::vector<std::byte> saved(plan.saved_bytes()), ws(std::max(plan.forward_workspace_bytes(), plan.backward_workspace_bytes()));
    distributed_attention(plan, comm, QkvIn().q(q).k(k).v(v), ByteSpan(o), rd::step_attention, saved, ws);
    distributed_attention_backward(plan, comm, ConstByteSpan(dos), QkvGradOut().dq(dq).dk(dk).dv(dv), rd::step_backward, saved, ws);
    const auto W = static_cast<std::size_t>(w);
    r[0][W] = o, r[1][W] = dq, r[2][W] = dk, r[3][W] = dv;
  });
  return {gather(seq, c.B, c.H, c.Dv, r[0]), gather(seq, c.B, c.H, c.D, r[1]), gather(seq, c.B, c.Hkv, c.D, r[2]),
          gather(seq, c.B, c.Hkv, c.Dv, r[3])};
}
}  // namespace

TEST_CASE("the same bits as the hand-written driver it replaced (dq: from R = 1), and within 2e-5 of the double reference") {
  for (std::size_t i = 0; i < sizeof(kCases) / sizeof(kCases[0]); ++i) {
    const rd::RingCase c = ring_case(kCases[i]);
    INFO("case " << i << ": U=" << c.U << " R=" << c.R << " S=" << c.S << " H=" << c.H << " Hkv=" << c.Hkv << " B=" << c.B << (c.causal ? " causal" : ""));
    const rd::RingGlobals g(c);
    const auto res = rd::run_ring_attention(c, g, true);
    std::uint64_t h[5];
    for (auto& x : h) x = 0xcbf29ce484222325ull;
    for (const auto& r : res)
      h[0] = hash_bits(h[0], r.out), h[1] = hash_bits(h[1], r.lse), h[2] = hash_bits(h[2], r.dq), h[3] = hash_bits(h[3], r.dk), h[4] = hash_bits(h[4], r.dv);
    CHECK(h[0] == kOld[i][0]);
    CHECK(h[1] == kOld[i][1]);
    if (c.R == 1) CHECK(h[2] == kOld[i][2]);  // R > 1: each step's dq partial is summed in fp32 (ring-flash-attention's order)
    CHECK(h[3] == kOld[i][3]);
    CHECK(h[4] == kOld[i][4]);
    const rd::RingErrors e = rd::max_errors(c, rd::RingReference(c, g, true), res);
    CHECK(e.max() < 2e-5);
  }
}

TEST_CASE("plain Ulysses (no ring communicator): any sequence partition, the same bits as R = 1 through the ring overload") {
  for (auto [H, Hkv] : {std::pair<std::int64_t, std::int64_t>{8, 8}, {8, 2}, {8, 1}})
    for (bool causal : {true, false}) {
      rd::RingCase c;
      c.U = 4, c.R = 1, c.S = 22, c.H = H, c.Hkv = Hkv, c.B = 2, c.causal = causal;
      c.layout = RingLayout::contiguous;
      INFO("H=" << H << " Hkv=" << Hkv << (causal ? " causal" : ""));
      const rd::RingGlobals g(c);
      const auto ring = rd::run_ring_attention(c, g, true);  // R = 1 through a ring of one rank
      const SeqPartition world = RingPartition(c.S, c.U, 1, c.layout).seq_partition();
      std::vector<std::vector<float>> o(4), dq(4), dk(4), dv(4);
      for (std::size_t w = 0; w < 4; ++w) o[w] = ring[w].out, dq[w] = ring[w].dq, dk[w] = ring[w].dk, dv[w] = ring[w].dv;
      const std::vector<std::vector<float>> want = {gather(world, c.B, c.H, c.Dv, o), gather(world, c.B, c.H, c.D, dq), gather(world, c.B, c.Hkv, c.D, dk),
                                                    gather(world, c.B, c.Hkv, c.Dv, dv)};
      for (const SeqPartition& seq : {SeqPartition::balanced(c.S, 4), SeqPartition::zigzag(c.S, 4), SeqPartition::lengths({3, 9, 4, 6})})
        CHECK(same_bits(plain_ulysses(c, g, seq), want));  // the head side sees the whole sequence in global order: the same bits
    }
}

TEST_CASE("head bands: G = 1 .. H_r + 1 bands give the unbanded bits (GQA, MQA, uneven remainders, empty bands); a zero-copy ring refuses them") {
  for (auto [H, Hkv] : {std::pair<std::int64_t, std::int64_t>{6, 6}, {6, 2}, {6, 1}, {8, 2}})
    for (bool causal : {true, false}) {
      rd::RingCase c;
      c.U = 2, c.R = 1, c.S = 13, c.H = H, c.Hkv = Hkv, c.B = 2, c.causal = causal;
      c.layout = RingLayout::contiguous;
      const rd::RingGlobals g(c);
      const SeqPartition seq = SeqPartition::zigzag(c.S, 2);
      const std::vector<std::vector<float>> want = plain_ulysses(c, g, seq);
      for (int G = 2; G <= H / 2 + 1; ++G) {
        INFO("H=" << H << " Hkv=" << Hkv << (causal ? " causal" : "") << " G=" << G);
        CHECK(same_bits(plain_ulysses(c, g, seq, G), want));
      }
      for (Progress pr : {Progress::in_start, Progress::thread}) {  // the options' progress drives the band pipeline: the same bits
        INFO("H=" << H << " Hkv=" << Hkv << (causal ? " causal" : "") << " G=2, progress " << static_cast<int>(pr));
        CHECK(same_bits(plain_ulysses(c, g, seq, 2, pr), want));
      }
    }
  const AttentionSpecs specs = attention_specs<float>(2, {4, 4, 8, 8});
  DistributedAttentionOptions opt;
  opt.bands = 2;
  const RingPlan ring(RingPartition(16, 2, 2, RingLayout::zigzag), Mesh(4, 2, 2, 4), 0, 1, specs, true);
  CHECK(DistributedAttentionPlan(ring, opt).qkv_plan().num_stages() == 2);  // bands × ring steps (the next case)
  opt.ring_access = RingAccess::zero_copy;
  const auto ring_err = ut::error_of([&] { DistributedAttentionPlan p(ring, opt); });
  CHECK(ring_err.first == Errc::invalid_shape);
  CHECK(ring_err.second.find("not on an all-gather-KV plan or a zero-copy ring") != std::string::npos);
  opt.ring_access = RingAccess::copy;
  opt.bands = kMaxStages + 1;
  const auto many = ut::error_of([&] { DistributedAttentionPlan p({2, 0}, 1, SeqPartition::balanced(16, 2), specs, true, opt); });
  CHECK(many.first == Errc::invalid_shape);
  CHECK(many.second.find(std::to_string(kMaxStages + 1) + " bands") != std::string::npos);
}

TEST_CASE("head bands over a ring (U x R = 2 x 2): bands x ring steps give the unbanded bits, forward and backward (GQA, MQA, uneven H, causal zigzag and contiguous, non-causal; both progress modes)") {
  struct Shape {
    std::int64_t H, Hkv;
  };
  const std::vector<std::int64_t> kDocs{0, 9, 9, 23};  // packed documents, with a placeholder
  for (const Shape sh : {Shape{8, 8}, Shape{8, 4}, Shape{8, 1}, Shape{6, 2}, Shape{5, 5}})  // (5 heads: 3 and 2 per rank, balanced)
    for (int layout = 0; layout < 4; ++layout) {  // causal zigzag, causal contiguous, non-causal, packed documents
      rd::RingCase c;
      c.U = 2, c.R = 2, c.S = 23, c.H = sh.H, c.Hkv = sh.Hkv, c.B = 2, c.D = 8, c.Dv = 4;
      c.causal = layout != 2;
      c.layout = layout == 1 ? RingLayout::contiguous : RingLayout::zigzag;
      if (layout == 3) c.cu_seqlens = kDocs;
      const rd::RingGlobals g(c);
      std::int64_t unbanded_calls = 0;  // the unbanded forward's kernel calls on world rank 0 (its steps with work)
      rd::RingCase c0 = c;
      c0.on_step = [&](int w, const AttentionStep&) {
        if (w == 0) ++unbanded_calls;  // (rank 0's thread only)
      };
      const auto want = rd::run_ring_attention(c0, g, true);
      const std::int64_t Hq = (sh.H + 1) / 2;  // (world rank 0's query heads)
      for (int G = 2; G <= Hq + 1; ++G) {
        INFO("H=" << sh.H << " Hkv=" << sh.Hkv << " layout " << layout << " G=" << G);
        rd::RingCase cb = c;
        cb.bands = G;
        std::mutex m;
        std::vector<std::int64_t> heads_seen;  // q_count of every call on world rank 0
        std::int64_t k_row = 0;                // k_stride.row of rank 0's calls
        cb.on_step = [&](int w, const AttentionStep& st) {
          std::lock_guard<std::mutex> lock(m);
          if (w != 0) return;
          heads_seen.push_back(st.heads.q_count);
          k_row = st.k_stride.row;
        };
        const auto got = rd::run_ring_attention(cb, g, true);
        for (std::size_t w = 0; w < got.size(); ++w) check_same_results(want[w], got[w]);
        // Each band's ring calls the kernel with the band's heads (every query head once per step
        // with work), over its own packed k|v block (k rows of the band's kv heads only).
        std::int64_t total = 0;
        for (std::int64_t n : heads_seen) total += n;
        CHECK(total == Hq * unbanded_calls);
        CHECK(*std::max_element(heads_seen.begin(), heads_seen.end()) == (Hq + G - 1) / G);
        const std::int64_t Hkv_u = std::max<std::int64_t>(1, (sh.Hkv + 1) / 2);  // (world rank 0's)
        if (Hkv_u > 1) CHECK(k_row < Hkv_u * c.D);  // (the unbanded block's row: Hkv_u · D)
        else CHECK(k_row == c.D);
      }
      for (Progress pr : {Progress::in_start, Progress::thread}) {
        INFO("H=" << sh.H << " Hkv=" << sh.Hkv << " layout " << layout << " G=2, progress " << static_cast<int>(pr));
        rd::RingCase cb = c;
        cb.bands = 2;
        const auto got = rd::run_ring_attention(cb, g, true, pr);
        for (std::size_t w = 0; w < got.size(); ++w) check_same_results(want[w], got[w]);
      }
    }
  // A kernel that throws in band 1 at ring step 1 on one rank: a coded error on every rank of both groups.
  rd::RingCase c;
  c.U = 2, c.R = 2, c.S = 23, c.H = 8, c.Hkv = 4, c.B = 1, c.bands = 2;
  c.on_step = [](int w, const AttentionStep& st) {
    if (w == 3 && st.step == 1 && st.heads.q_begin > 0) throw std::runtime_error("the engine's kernel failed in band 1, ring step 1");
  };
  const rd::RingGlobals g(c);
  std::vector<std::pair<Errc, std::string>> res(4);
  const auto t0 = std::chrono::steady_clock::now();
  LocalMesh(2, 2, std::chrono::seconds(30)).spawn([&](int w, LocalGroup::Comm& uc, LocalGroup::Comm& rc) {
    try {
      rd::ring_rank_attention(c, g, w, uc, rc, true);
    } catch (const Error& e) {
      res[static_cast<std::size_t>(w)] = {e.code(), e.what()};
    } catch (const std::exception& e) {
      res[static_cast<std::size_t>(w)] = {Errc::backend, e.what()};
    }
  });
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  for (int w = 0; w < 4; ++w) {
    INFO("rank " << w << ": " << res[static_cast<std::size_t>(w)].second);
    CHECK(res[static_cast<std::size_t>(w)].first == (w == 3 ? Errc::backend : Errc::aborted));
  }
  CHECK(ms < 10000);  // the peers of both groups heard at once (the groups' deadline is 30 s)
}

TEST_CASE("head bands over a ring with Progress::thread: a communicator that cannot be called from two threads at once is refused before any data moves") {
  struct Serialized {  // (MpiComm under MPI_THREAD_SERIALIZED says so)
    bool allows_concurrent_threads() const { return false; }
  };
  struct Multiple {
    bool allows_concurrent_threads() const { return true; }
  };
  const RingPlan ring(RingPartition(16, 2, 2, RingLayout::zigzag), Mesh(4, 2, 2, 4), 0, 1, attention_specs<float>(2, {4, 4, 8, 8}), true);
  DistributedAttentionOptions opt;
  opt.bands = 2;
  opt.progress = Progress::thread;
  const DistributedAttentionPlan threaded(ring, opt);
  const Serialized s;
  const Multiple m;
  for (int i = 0; i < 2; ++i) {
    const auto e = ut::error_of([&] { i ? detail::check_band_ring_threads(threaded, s, m, "x") : detail::check_band_ring_threads(threaded, m, s, "x"); });
    CHECK(e.first == Errc::invalid_shape);
    CHECK(e.second.find("MPI_THREAD_MULTIPLE") != std::string::npos);
  }
  CHECK_NOTHROW(detail::check_band_ring_threads(threaded, m, m, "x"));
  opt.progress = Progress::in_start;  // (the exchanges posted on this thread: nothing runs at once)
  CHECK_NOTHROW(detail::check_band_ring_threads(DistributedAttentionPlan(ring, opt), s, s, "x"));
}

TEST_CASE("head bands: the kernel is called once per band with the band's heads, in order; a kernel that throws in band 1 on one rank is a coded error on every rank, at once") {
  rd::RingCase c;
  c.U = 4, c.R = 1, c.S = 22, c.H = 12, c.Hkv = 4, c.B = 1, c.causal = true, c.bands = 3;  // H_r = 3 query heads on 1 kv head
  c.layout = RingLayout::contiguous;
  const rd::RingGlobals g(c);
  std::mutex m;
  std::vector<std::vector<AttentionHeads>> calls(4);
  c.on_step = [&](int w, const AttentionStep& st) {
    std::lock_guard<std::mutex> lock(m);
    calls[static_cast<std::size_t>(w)].push_back(st.heads);
    CHECK(st.heads.kv_of(0) == 0);  // (kv_map lives for the call)
    CHECK(st.out_stride.row == 3 * c.Dv);  // the whole partial output's strides
    CHECK(st.lse_stride.head == st.q_len);
  };
  std::vector<std::pair<Errc, std::string>> res(4);
  auto run = [&] {
    LocalGroup group(4, std::chrono::seconds(30));
    group.spawn([&](LocalGroup::Comm& comm) {
      try {
        rd::ring_rank_attention(c, g, comm.rank(), comm, comm, true);
      } catch (const Error& e) {
        res[static_cast<std::size_t>(comm.rank())] = {e.code(), e.what()};
      } catch (const std::exception& e) {
        res[static_cast<std::size_t>(comm.rank())] = {Errc::backend, e.what()};
      }
    });
  };
  run();
  for (int w = 0; w < 4; ++w) {
    CHECK(res[static_cast<std::size_t>(w)].first == Errc{});
    const auto& h = calls[static_cast<std::size_t>(w)];
    REQUIRE(h.size() == 3u);
    for (std::int64_t b = 0; b < 3; ++b) {
      const AttentionHeads& x = h[static_cast<std::size_t>(b)];
      CHECK(x.q_begin == b);
      CHECK(x.q_count == 1);
      CHECK(x.kv_begin == 0);
      CHECK(x.kv_count == 1);
      CHECK(x.q_global == 3 * w + b);
      CHECK(x.kv_global == w);
      CHECK(x.grouped);
    }
  }
  c.on_step = [](int w, const AttentionStep& st) {
    if (w == 1 && st.heads.q_begin == 1) throw std::runtime_error("the engine's kernel failed in band 1");
  };
  const auto t0 = std::chrono::steady_clock::now();
  run();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  for (int w = 0; w < 4; ++w) {
    INFO("rank " << w << ": " << res[static_cast<std::size_t>(w)].second);
    CHECK(res[static_cast<std::size_t>(w)].first == (w == 1 ? Errc::backend : Errc::aborted));
  }
  CHECK(ms < 10000);  // the peers heard at once (the group's deadline is 30 s)
}

TEST_CASE("the same bits with either progress mode, with either ring access (copy, zero_copy), and on every run") {
  rd::RingCase c = ring_case({2, 2, 22, 4, 1, 2, true});
  const rd::RingGlobals g(c);
  const auto a = rd::run_ring_attention(c, g, true, RingProgress::thread);
  const auto b = rd::run_ring_attention(c, g, true, RingProgress::in_start);
  const auto d = rd::run_ring_attention(c, g, true);
  const auto z = rd::run_ring_attention(c, g, true, RingProgress::automatic, RingAccess::zero_copy);  // each step reads the owner's kv0
  rd::RingCase c4 = ring_case({1, 4, 29, 4, 2, 2, true});  // R = 4: the backward's adds into the owners' g0 cross three hops
  const rd::RingGlobals g4(c4);
  const auto e = rd::run_ring_attention(c4, g4, true);
  const auto f = rd::run_ring_attention(c4, g4, true, RingProgress::in_start, RingAccess::zero_copy);
  for (std::size_t w = 0; w < e.size(); ++w) check_same_results(e[w], f[w]);
  for (std::size_t w = 0; w < a.size(); ++w)
    for (const auto* x : {&b, &d, &z}) check_same_results(a[w], (*x)[w]);
}

namespace {
/// One rank of a U × R hybrid of case c with hooks: `make` may change the rank's RingPlan inputs,
/// `attn` / `bwd` wrap the example's kernels; the rank's result (out) is returned.
struct Hooks {
  std::function<void(int w, bool& causal)> config = [](int, bool&) {};
  std::function<void(int w, const AttentionStep&)> step = [](int, const AttentionStep&) {};
  std::function<void(int w, const AttentionGradStep&)> grad = [](int, const AttentionGradStep&) {};
  std::function<std::size_t(int w, std::size_t)> saved = [](int, std::size_t n) { return n; };
  RingAccess access = RingAccess::copy;  // the plan's ring access
};
template <class RC>
void hooked_rank(const rd::RingCase& c, const rd::RingGlobals& g, int w, LocalGroup::Comm& uc, RC& rc, const Hooks& hk) {
  const RingPartition part(c.S, c.U, c.R, c.layout);
  bool causal = c.causal;
  hk.config(w, causal);
  const RingPlan rp(part, Mesh(c.U * c.R, c.U, c.R, c.U * c.R), w, c.B, attention_specs<float>(c.U, {c.H, c.Hkv, c.D, c.Dv}), causal);
  DistributedAttentionOptions opt;
  opt.ring_access = hk.access;
  const DistributedAttentionPlan plan(rp, opt);
  const SeqPartition world = part.seq_partition();
  const auto q = rd::ring_shard(c, world, w, g.q, c.H, c.D), k = rd::ring_shard(c, world, w, g.k, c.Hkv, c.D), v = rd::ring_shard(c, world, w, g.v, c.Hkv, c.Dv);
  const auto dos = rd::ring_shard(c, world, w, g.dout, c.H, c.Dv);
  std::vector<float> o(dos.size()), dq(q.size()), dk(k.size()), dv(v.size());
  std::vector<std::byte> saved(hk.saved(w, plan.saved_bytes())), ws(std::max(plan.forward_workspace_bytes(), plan.backward_workspace_bytes()));
  distributed_attention(plan, uc, rc, QkvIn().q(q).k(k).v(v), ByteSpan(o), [&](const AttentionStep& st) { hk.step(w, st), rd::step_attention(st); }, saved, ws);
  distributed_attention_backward(plan, uc, rc, ConstByteSpan(dos), QkvGradOut().dq(dq).dk(dk).dv(dv),
                                 [&](const AttentionGradStep& st) { hk.grad(w, st), rd::step_backward(st); }, saved, ws);
}
/// Runs hooked_rank() on every rank of a LocalMesh (timeout 30 s); each rank's error code
/// (Errc{} when none) and message; `ms` the time until every rank returned.
std::vector<std::pair<Errc, std::string>> run_hooked(const rd::RingCase& c, const Hooks& hk, double* ms = nullptr) {
  const rd::RingGlobals g(c);
  std::vector<std::pair<Errc, std::string>> res(static_cast<std::size_t>(c.U * c.R));
  const auto t0 = std::chrono::steady_clock::now();
  LocalMesh(c.U, c.R, std::chrono::seconds(30)).spawn([&](int w, LocalGroup::Comm& uc, LocalGroup::Comm& rc) {
    try {
      hooked_rank(c, g, w, uc, rc, hk);
    } catch (const Error& e) {
      res[static_cast<std::size_t>(w)] = {e.code(), e.what()};
    } catch (const std::exception& e) {
      res[static_cast<std::size_t>(w)] = {Errc::backend, std::string("not an Error: ") + e.what()};
    }
  });
  if (ms) *ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return res;
}
}  // namespace

TEST_CASE("the step the kernel sees: ranges, global tokens, mask, heads, strides (U x R = 2 x 2, causal zigzag, GQA)") {
  rd::RingCase c = ring_case({2, 2, 22, 4, 2, 2, true});
  const RingPartition part(c.S, c.U, c.R, c.layout);
  std::mutex m;
  std::vector<std::vector<int>> steps(4);
  Hooks hk;
  hk.step = [&](int w, const AttentionStep& st) {
    const int j = w / c.U, u = w % c.U;
    const RingWork want = ring_work(part, j, st.step, true);
    std::lock_guard<std::mutex> lock(m);
    steps[static_cast<std::size_t>(w)].push_back(st.step);
    CHECK(st.steps == 2);
    CHECK(st.source == want.source);
    CHECK(st.q_len == want.q_len);
    CHECK(st.kv_len == want.kv_len);
    CHECK(st.mask == want.mask);
    CHECK(st.causal() == (st.step == 0));
    CHECK(st.batch == 2);
    CHECK(st.softmax_scale == 1.0f / std::sqrt(8.0f));
    CHECK(st.heads.q_count == 2);
    CHECK(st.heads.kv_count == 1);
    CHECK(st.heads.q_global == 2 * u);
    CHECK(st.heads.kv_global == u);
    CHECK(st.heads.grouped);
    CHECK(st.heads.kv_of(1) == 0);
    CHECK(st.q_stride.row == 2 * 8);
    CHECK(st.q_stride.batch == part.ring_length(j) * 2 * 8);
    CHECK(st.k_stride.batch == part.ring_length(want.source) * 8);
    CHECK(st.lse_stride.head == st.q_len);
    CHECK(st.q_tokens.rows() == st.q_len);
    CHECK(st.kv_tokens.rows() == st.kv_len);
    for (std::int64_t i = 0; i < st.q_len; ++i) CHECK(st.q_tokens.global(i) == part.ring_token(j, want.q_begin + i));
    for (std::int64_t i = 0; i < st.kv_len; ++i) CHECK(st.kv_tokens.global(i) == part.ring_token(want.source, want.kv_begin + i));
  };
  hk.grad = [&](int, const AttentionGradStep& st) {
    CHECK(st.o_stride.row == 2 * 8);
    CHECK(st.dk_stride.row == 8);
    CHECK(st.lse_stride.head == st.fwd.work.L_q);
  };
  for (const auto& r : run_hooked(c, hk)) CHECK(r.first == Errc{});
  for (const auto& s : steps) CHECK(s == std::vector<int>{0, 1});  // once per step, in order
}

TEST_CASE("errors: communicator sizes, the Ulysses-only overload of a ring plan, a configuration that differs") {
  const rd::RingCase c = ring_case({2, 2, 22, 4, 4, 1, true});
  const rd::RingGlobals g(c);
  std::vector<Errc> codes(4), plain(4);
  LocalMesh(2, 2, std::chrono::seconds(30)).spawn([&](int w, LocalGroup::Comm& uc, LocalGroup::Comm&) {
    LocalGroup one(1);  // a ring of one rank for R = 2 (bug case C14: the hybrid that would run as CP=1)
    LocalGroup::Comm rc = one.comm(0);
    Hooks hk;
    codes[static_cast<std::size_t>(w)] = ut::code_of([&] { hooked_rank(c, g, w, uc, rc, hk); });
    const RingPlan rp(RingPartition(c.S, 2, 2, c.layout), Mesh(4, 2, 2, 4), w, 1, attention_specs<float>(2, {4, 4, 8}), true);
    const DistributedAttentionPlan plan(rp);
    std::vector<float> x(1 << 12);
    std::vector<std::byte> b(1 << 16);
    plain[static_cast<std::size_t>(w)] =
        ut::code_of([&] { distributed_attention(plan, uc, QkvIn().q(x).k(x).v(x), ByteSpan(x), rd::step_attention, b, b); });
  });
  for (int w = 0; w < 4; ++w) CHECK(codes[static_cast<std::size_t>(w)] == Errc::comm_mismatch);
  for (int w = 0; w < 4; ++w) CHECK(plain[static_cast<std::size_t>(w)] == Errc::comm_mismatch);
  Hooks hk;
  hk.config = [](int w, bool& causal) { causal = w != 3; };  // rank 3 plans a non-causal attention
  for (const auto& r : run_hooked(c, hk)) CHECK(r.first == Errc::plan_mismatch);
}

TEST_CASE("errors: a short span or a kernel that throws on one rank is a coded error on every rank, at once") {
  const rd::RingCase c = ring_case({2, 2, 22, 4, 2, 1, true});
  for (int what = 0; what < 3; ++what) {
    Hooks hk;
    if (what == 0) hk.saved = [](int w, std::size_t n) { return w == 2 ? n - 64 : n; };
    if (what == 1)
      hk.step = [](int w, const AttentionStep& st) {
        if (w == 1 && st.step == 1) throw std::runtime_error("the engine's kernel failed");
      };
    if (what == 2)
      hk.grad = [](int w, const AttentionGradStep& st) {
        if (w == 3 && st.fwd.step == 0) throw Error(Errc::invalid_shape, "the engine's backward kernel failed");
      };
    double ms = 0;
    const auto r = run_hooked(c, hk, &ms);
    INFO("case " << what << ": " << r[0].second << " | " << r[1].second << " | " << r[2].second << " | " << r[3].second);
    const int bad = what == 0 ? 2 : what == 1 ? 1 : 3;
    for (int w = 0; w < 4; ++w) {
      const Errc want = w != bad ? Errc::aborted : what == 0 ? Errc::buffer_too_small : what == 1 ? Errc::backend : Errc::invalid_shape;
      CHECK(r[static_cast<std::size_t>(w)].first == want);
    }
    CHECK(ms < 10000);  // the peers heard at once (the groups' deadline is 30 s)
  }
}

TEST_CASE("zero copy: a kernel that throws on one rank lets its peers finish with its blocks first; a coded error on every rank") {
  // R = 4 (U = 1): a peer reads the failing rank's kv0 (and, backward, adds into its g0) in a step
  // that runs after the failure; the failing rank's workspace is freed as it unwinds, so it must
  // wait for them (RingSharedBlocks::abandon(); under the sanitizers a read after the free is an
  // error). Forward: rank 0 fails at step 0, ranks 1, 2, 3 read its block at steps 1, 2, 3 (no
  // collective in between). Backward: rank 3 fails at step 1, where rank 0 reads its kv0 and adds
  // into its g0; the start(2) synchronisation then stops every rank.
  const rd::RingCase c = ring_case({1, 4, 29, 4, 2, 1, true});
  for (int what = 0; what < 2; ++what) {
    Hooks hk;
    hk.access = RingAccess::zero_copy;
    std::atomic<int> late_reads{0};
    if (what == 0)
      hk.step = [&](int w, const AttentionStep& st) {
        if (w == 0 && st.step == 0) throw Error(Errc::invalid_shape, "the engine's kernel failed");
        if (w != 0 && st.source == 0) {  // the failing rank's block, read after it has thrown
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          late_reads += st.kv_len > 0;
        }
      };
    else
      hk.grad = [&](int w, const AttentionGradStep& st) {
        if (w == 3 && st.fwd.step == 1) throw Error(Errc::invalid_shape, "the engine's backward kernel failed");
        if (w != 3 && st.fwd.source == 3) {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          late_reads += st.fwd.kv_len > 0;
        }
      };
    double ms = 0;
    const auto r = run_hooked(c, hk, &ms);
    INFO("case " << what << ": " << r[0].second << " | " << r[1].second << " | " << r[2].second << " | " << r[3].second);
    const int bad = what == 0 ? 0 : 3;
    for (int w = 0; w < 4; ++w) {
      const Errc e = r[static_cast<std::size_t>(w)].first;
      if (w == bad) CHECK(e == Errc::invalid_shape);
      else CHECK((e == Errc::aborted || e == Errc::plan_mismatch));
    }
    CHECK(late_reads.load() == (what == 0 ? 3 : 1));  // the peers' steps with the failing rank's block ran to their end
    CHECK(ms < 10000);               // no deadline waited out (the groups' is 30 s)
  }
}

namespace {
struct bf16 {
  std::uint16_t bits;
};
float to_float(bf16 x) {
  const std::uint32_t u = std::uint32_t{x.bits} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
bf16 to_bf16(float f) {  // to nearest, ties to even (finite inputs)
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return {static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}
/// A bf16 view [B, rows, heads, dim] at its strides, as an fp32 contiguous copy (strides back in `st`).
std::vector<float> widen(const void* p, AttentionStrides& st, std::int64_t B, std::int64_t rows, std::int64_t heads, std::int64_t dim) {
  std::vector<float> x;
  const auto* b16 = static_cast<const bf16*>(p);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t h = 0; h < heads; ++h)
        for (std::int64_t d = 0; d < dim; ++d) x.push_back(to_float(b16[b * st.batch + i * st.row + h * st.head + d]));
  st = {rows * heads * dim, heads * dim, dim};
  return x;
}
/// The example's fp32 kernel on a bf16 step: q, k, v widened, out rounded once to bf16.
void bf16_attention(const AttentionStep& st) {
  AttentionStep f = st;
  const std::int64_t B = st.batch, Hq = st.heads.q_count, Hk = st.heads.kv_count;
  const std::vector<float> q = widen(st.q, f.q_stride, B, st.q_len, Hq, st.head_dim), k = widen(st.k, f.k_stride, B, st.kv_len, Hk, st.head_dim),
                           v = widen(st.v, f.v_stride, B, st.kv_len, Hk, st.v_head_dim);
  std::vector<float> o(static_cast<std::size_t>(B * st.q_len * Hq * st.v_head_dim), 0.0f);
  f.q = q.data(), f.k = k.data(), f.v = v.data(), f.out = o.data();
  f.out_stride = {st.q_len * Hq * st.v_head_dim, Hq * st.v_head_dim, st.v_head_dim};
  rd::step_attention(f);
  auto* out = static_cast<bf16*>(st.out);
  for (std::int64_t b = 0, e = 0; b < B; ++b)
    for (std::int64_t i = 0; i < st.q_len; ++i)
      for (std::int64_t h = 0; h < Hq; ++h)
        for (std::int64_t d = 0; d < st.v_head_dim; ++d) out[b * st.out_stride.batch + i * st.out_stride.row + h * st.out_stride.head + d] = to_bf16(o[std::size_t(e++)]);
}
/// The example's fp32 backward on a bf16 step (the partials are fp32 already).
void bf16_backward(const AttentionGradStep& g) {
  AttentionGradStep f = g;
  const AttentionStep& st = g.fwd;
  const std::int64_t B = st.batch, Hq = st.heads.q_count, Hk = st.heads.kv_count;
  const std::vector<float> q = widen(st.q, f.fwd.q_stride, B, st.q_len, Hq, st.head_dim), k = widen(st.k, f.fwd.k_stride, B, st.kv_len, Hk, st.head_dim),
                           v = widen(st.v, f.fwd.v_stride, B, st.kv_len, Hk, st.v_head_dim);
  AttentionStrides os = g.o_stride;
  const std::vector<float> o = widen(g.o, os, B, st.q_len, Hq, st.v_head_dim), dout = widen(g.dout, f.o_stride, B, st.q_len, Hq, st.v_head_dim);
  f.fwd.q = q.data(), f.fwd.k = k.data(), f.fwd.v = v.data(), f.o = o.data(), f.dout = dout.data();
  rd::step_backward(f);
}
}  // namespace

TEST_CASE("bfloat16: U x R = 2 x 2 causal zigzag, MQA, B = 2, forward and backward, within bf16 rounding of the double reference") {
  for (auto [U, R] : {std::pair{2, 2}, {4, 1}}) {
    rd::RingCase c = ring_case({U, R, 22, 4, 1, 2, true});
    rd::RingGlobals g(c);
    for (auto* x : {&g.q, &g.k, &g.v, &g.dout})
      for (float& e : *x) e = to_float(to_bf16(e));  // the inputs as bf16 hold them
    const rd::RingReference ref(c, g, true);
    rd::RingErrors err;
    std::mutex m;
    LocalMesh(U, R, std::chrono::seconds(60)).spawn([&](int w, LocalGroup::Comm& uc, LocalGroup::Comm& rc) {
      const RingPartition part(c.S, c.U, c.R, c.layout);
      const AttentionSpecs specs = attention_specs<bf16>(c.U, {c.H, c.Hkv, c.D, c.Dv}, ElementType::bfloat16);
      const DistributedAttentionPlan plan(RingPlan(part, Mesh(U * R, U, R, U * R), w, c.B, specs, true));
      const SeqPartition world = part.seq_partition();
      auto shard = [&](const std::vector<float>& x, std::int64_t Hx, std::int64_t Dx) {
        std::vector<bf16> s;
        for (float e : rd::ring_shard(c, world, w, x, Hx, Dx)) s.push_back(to_bf16(e));
        return s;
      };
      const auto q = shard(g.q, c.H, c.D), k = shard(g.k, c.Hkv, c.D), v = shard(g.v, c.Hkv, c.Dv), dos = shard(g.dout, c.H, c.Dv);
      std::vector<bf16> o(dos.size()), dq(q.size()), dk(k.size()), dv(v.size());
      std::vector<std::byte> saved(plan.saved_bytes()), ws(std::max(plan.forward_workspace_bytes(), plan.backward_workspace_bytes()));
      distributed_attention(plan, uc, rc, QkvIn().q(q).k(k).v(v), ByteSpan(o), bf16_attention, saved, ws);
      distributed_attention_backward(plan, uc, rc, ConstByteSpan(dos), QkvGradOut().dq(dq).dk(dk).dv(dv), bf16_backward, saved, ws);
      rd::RingRankResult rr;
      auto wide = [](const std::vector<bf16>& x) {
        std::vector<float> f;
        for (bf16 e : x) f.push_back(to_float(e));
        return f;
      };
      rr.out = wide(o), rr.dq = wide(dq), rr.dk = wide(dk), rr.dv = wide(dv);
      const float* lse = plan.saved_lse(saved);
      rr.lse.assign(lse, lse + c.B * plan.query_heads() * plan.tokens());
      rr.h0 = specs.query_heads.begin(w % U), rr.Hq = plan.query_heads(), rr.L = plan.tokens();
      for (std::int64_t i = 0; i < rr.L; ++i) rr.tokens.push_back(part.ring_token(w / U, i));
      const rd::RingErrors e = rd::rank_errors(c, ref, w, rr);
      std::lock_guard<std::mutex> lock(m);
      err.max_with(e);
    });
    INFO("U=" << U << " R=" << R << ": o " << err.out << ", lse " << err.lse << ", dq " << err.dq << ", dk " << err.dk << ", dv " << err.dv);
    CHECK(err.out < 2e-2);
    CHECK(err.lse < 1e-4);  // fp32 from bf16 inputs: only the partials' rounding
    CHECK(err.dq < 2e-2);
    CHECK(err.dk < 2e-2);
    CHECK(err.dv < 2e-2);
    CHECK(err.max() > 0);  // (bf16 did round)
  }
}

namespace {
/// Packed-document cases (C20, C21): one path of the case's documents.
struct DocPath {
  const char* name;
  int U, R;
  bool allgather;
  bool ulysses_allgather = false;  // U x AG: Ulysses over U, k|v gathered over the R ranks
};
const DocPath kDocPaths[] = {{"Ulysses P=2", 2, 1, false},         {"Ulysses P=4", 4, 1, false},
                             {"U=1 x R=2", 1, 2, false},           {"U=2 x R=2", 2, 2, false},
                             {"all-gather KV P=2", 2, 1, true},    {"all-gather KV P=4", 4, 1, true},
                             {"U=2 x AG R=2", 2, 2, false, true}};
rd::RingCase doc_case(const DocPath& p, std::int64_t S, std::vector<std::int64_t> cu, bool causal) {
  rd::RingCase c;
  c.U = p.U, c.R = p.R, c.allgather = p.allgather, c.S = S, c.H = 4, c.Hkv = 2, c.D = 8, c.Dv = 8, c.B = 1, c.causal = causal;
  c.ulysses_allgather = p.ulysses_allgather;
  c.cu_seqlens = std::move(cu);
  return c;
}
/// Every step's mask is document ∧ causal (or document-only): blocks, each row pair as the case says,
/// no empty block; counts the steps seen.
void check_masks(rd::RingCase& c, std::atomic<int>& steps, std::atomic<int>& wrong) {
  c.on_step = [&c, &steps, &wrong](int, const AttentionStep& st) {
    ++steps;
    if (st.mask != RingMask::blocks || st.block_count < 1) ++wrong;
    for (std::int64_t b = 0; b < st.block_count; ++b)
      if (st.blocks[b].q_len < 1 || st.blocks[b].kv_len < 1) ++wrong;
    for (std::int64_t i = 0; i < st.q_len; ++i)
      for (std::int64_t k = 0; k < st.kv_len; ++k)
        if (st.attends(i, k) != c.attends(st.q_tokens.global(i), st.kv_tokens.global(k))) ++wrong;
  };
}
/// The rows (global tokens) of world rank w's seq shard.
std::vector<std::int64_t> shard_tokens(const rd::RingCase& c, int w) {
  const SeqPartition world = rd::world_partition(c);
  std::vector<std::int64_t> t;
  for (std::int64_t i = 0; i < world.local_length(w); ++i) t.push_back(world.global_token(w, i));
  return t;
}
/// Whether rows `token` of x [B=1, S_w, n] (seq shard of rank w) hold the same bits in a and b.
bool same_row(const std::vector<float>& a, const std::vector<float>& b, std::int64_t row, std::int64_t n) {
  return std::memcmp(&a[static_cast<std::size_t>(row * n)], &b[static_cast<std::size_t>(row * n)], static_cast<std::size_t>(n) * sizeof(float)) == 0;
}
bool has_nan(const std::vector<float>& x) {
  for (float f : x)
    if (std::isnan(f)) return true;
  return false;
}
}  // namespace

TEST_CASE("C21: packed documents do not see each other (Ulysses, U x R with per-document zigzag, all-gather KV; causal and document-only)") {
  for (const auto& cu : {std::vector<std::int64_t>{0, 8, 16}, std::vector<std::int64_t>{0, 5, 16}})
    for (bool causal : {true, false})
      for (const DocPath& path : kDocPaths) {
        if (path.U * path.R > 2 && path.U != 2) continue;  // C21: P = 2 and U=2 x R=2
        rd::RingCase c = doc_case(path, 16, cu, causal);
        INFO(path.name << " cu_seqlens [0," << cu[1] << ",16]" << (causal ? " causal" : " document-only"));
        std::atomic<int> steps{0}, wrong{0};
        check_masks(c, steps, wrong);
        const rd::RingGlobals g0(c);
        rd::RingGlobals g1 = g0;  // the probe: +1.0 on q, k, v of token 3 (document 0)
        for (std::int64_t h = 0; h < c.H * c.D; ++h) g1.q[static_cast<std::size_t>(3 * c.H * c.D + h)] += 1.0f;
        for (std::int64_t h = 0; h < c.Hkv * c.D; ++h) g1.k[static_cast<std::size_t>(3 * c.Hkv * c.D + h)] += 1.0f;
        for (std::int64_t h = 0; h < c.Hkv * c.Dv; ++h) g1.v[static_cast<std::size_t>(3 * c.Hkv * c.Dv + h)] += 1.0f;
        const auto a = rd::run_ring_attention(c, g0, true), b = rd::run_ring_attention(c, g1, true);
        CHECK(steps.load() > 0);
        CHECK(wrong.load() == 0);
        CHECK(rd::max_errors(c, rd::RingReference(c, g0, true), a).max() < 2e-5);
        CHECK(rd::max_errors(c, rd::RingReference(c, g1, true), b).max() < 2e-5);
        const std::int64_t d0 = cu[1];  // the first token of document 1
        int changed_doc1 = 0, changed_early = 0, unchanged_late = 0;
        for (int w = 0; w < c.U * c.R; ++w) {
          const auto W = static_cast<std::size_t>(w);
          const std::vector<std::int64_t> tok = shard_tokens(c, w);
          for (std::size_t i = 0; i < tok.size(); ++i) {
            const auto row = static_cast<std::int64_t>(i);
            const bool o_same = same_row(a[W].out, b[W].out, row, c.H * c.Dv);
            if (tok[i] >= d0) {  // document 1: o, dk, dv bit for bit
              changed_doc1 += !o_same + !same_row(a[W].dk, b[W].dk, row, c.Hkv * c.D) + !same_row(a[W].dv, b[W].dv, row, c.Hkv * c.Dv);
            } else if (causal && tok[i] < 3) {
              changed_early += !o_same;  // before the probe: unchanged under causal
            } else {
              unchanged_late += o_same;  // the probe's document after it (all of it without causal): changed
            }
          }
          for (std::int64_t h = 0; h < a[W].Hq; ++h)  // the LSE rows of document 1 (head-sharded, ring-local)
            for (std::int64_t i = 0; i < a[W].L; ++i)
              if (a[W].tokens[static_cast<std::size_t>(i)] >= d0) {
                const auto at = static_cast<std::size_t>(h * a[W].L + i);
                changed_doc1 += std::memcmp(&a[W].lse[at], &b[W].lse[at], sizeof(float)) != 0;
              }
        }
        CHECK(changed_doc1 == 0);
        CHECK(changed_early == 0);
        CHECK(unchanged_late == 0);
      }
}

TEST_CASE("C20: zero-length documents in a padded cu_seqlens give the bits of [0,16,40], through every path, forward and backward") {
  for (const DocPath& path : kDocPaths) {
    if (path.U * path.R == 2 && path.R == 1 && path.allgather) continue;  // C20: all-gather KV P = 4
    INFO(path.name);
    rd::RingCase base = doc_case(path, 40, {0, 16, 40}, true);
    const rd::RingGlobals g(base);
    const auto want = rd::run_ring_attention(base, g, true);
    CHECK(rd::max_errors(base, rd::RingReference(base, g, true), want).max() < 2e-5);
    for (const auto& cu : {std::vector<std::int64_t>{0, 16, 40, 40, 40}, std::vector<std::int64_t>{0, 0, 16, 40}, std::vector<std::int64_t>{0, 16, 16, 40}}) {
      rd::RingCase c = doc_case(path, 40, cu, true);
      std::atomic<int> steps{0}, wrong{0};
      check_masks(c, steps, wrong);
      const auto got = rd::run_ring_attention(c, g, true);
      CHECK(wrong.load() == 0);
      for (std::size_t w = 0; w < got.size(); ++w) {
        check_same_results(got[w], want[w]);
        CHECK(!has_nan(got[w].out));
        CHECK(!has_nan(got[w].dq));
        CHECK(!has_nan(got[w].dk));
      }
    }
  }
  // A decreasing entry and a last entry other than S: refused before any plan or exchange.
  CHECK(ut::code_of([] { Documents({0, 16, 10, 40}, 40); }) == Errc::invalid_partition);
  CHECK(ut::code_of([] { Documents({0, 16, 39}, 40); }) == Errc::seq_lengths_mismatch);
}

TEST_CASE("packed documents: the plain Ulysses overload with documents gives the R = 1 bits; other documents on one rank are plan_mismatch on every rank") {
  for (bool causal : {true, false}) {
    rd::RingCase c = doc_case(kDocPaths[1], 22, {0, 3, 3, 12, 22}, causal);  // P = 4, a placeholder, uneven
    c.B = 2;
    const rd::RingGlobals g(c);
    const auto want = rd::run_ring_attention(c, g, true);
    CHECK(rd::max_errors(c, rd::RingReference(c, g, true), want).max() < 2e-5);
    const SeqPartition world = rd::world_partition(c);
    std::vector<std::vector<float>> o(4);
    for (std::size_t w = 0; w < 4; ++w) o[w] = want[w].out;
    const std::vector<float> ref_o = gather(world, c.B, c.H, c.Dv, o);
    for (const SeqPartition& seq : {SeqPartition::balanced(c.S, 4), SeqPartition::zigzag(c.S, 4),
                                    documents_partition(Documents(c.cu_seqlens), 4, DocumentSplit::balanced)}) {
      std::vector<std::vector<float>> got(4);
      LocalGroup group(4, std::chrono::seconds(30));
      group.spawn([&](LocalGroup::Comm& comm) {
        const int w = comm.rank();
        const DistributedAttentionPlan plan({4, w}, c.B, seq, attention_specs<float>(4, {c.H, c.Hkv, c.D, c.Dv}), causal, Documents(c.cu_seqlens));
        CHECK(plan.has_documents());
        const auto q = rd::ring_shard(c, seq, w, g.q, c.H, c.D), k = rd::ring_shard(c, seq, w, g.k, c.Hkv, c.D), v = rd::ring_shard(c, seq, w, g.v, c.Hkv, c.Dv);
        std::vector<float> out(static_cast<std::size_t>(c.B * seq.local_length(w) * c.H * c.Dv));
        std::vector<std::byte> saved(plan.saved_bytes()), ws(plan.forward_workspace_bytes());
        distributed_attention(plan, comm, QkvIn().q(q).k(k).v(v), ByteSpan(out), rd::step_attention, saved, ws);
        got[static_cast<std::size_t>(w)] = out;
      });
      CHECK(same_bits(gather(seq, c.B, c.H, c.Dv, got), ref_o));
    }
  }
  // Rank 1 packs other documents of the same S: every rank gets plan_mismatch before any data moves.
  std::vector<Errc> codes(2);
  LocalGroup group(2, std::chrono::seconds(30));
  group.spawn([&](LocalGroup::Comm& comm) {
    const int w = comm.rank();
    const Documents docs(w == 1 ? std::vector<std::int64_t>{0, 5, 16} : std::vector<std::int64_t>{0, 8, 16});
    for (bool ag : {false, true}) {
      const AttentionSpecs specs = attention_specs<float>(ag ? 1 : 2, {4, 2, 8});
      const SeqPartition seq = SeqPartition::balanced(16, 2);
      const DistributedAttentionPlan plan =
          ag ? DistributedAttentionPlan::allgather({2, w}, 1, seq, specs, true, &docs) : DistributedAttentionPlan({2, w}, 1, seq, specs, true, docs);
      std::vector<float> x(16 * 4 * 8);
      std::vector<std::byte> saved(plan.saved_bytes()), ws(plan.forward_workspace_bytes());
      const Errc e = ut::code_of([&] { distributed_attention(plan, comm, QkvIn().q(x).k(x).v(x), ByteSpan(x), rd::step_attention, saved, ws); });
      codes[static_cast<std::size_t>(w)] = e;
      CHECK(e == Errc::plan_mismatch);
    }
  });
}

TEST_CASE("packed documents: ring ranks of different lengths (per-document zigzag), placeholders, a document shorter than 2R; within 2e-5 of the reference") {
  for (const auto& [U, R] : {std::pair<int, int>{1, 6}, {2, 3}, {3, 2}})
    for (bool causal : {true, false}) {
      rd::RingCase c;
      c.U = U, c.R = R, c.S = 41, c.H = 6, c.Hkv = 3, c.D = 8, c.Dv = 8, c.B = 1, c.causal = causal;
      c.cu_seqlens = {0, 1, 1, 13, 41};
      INFO("U=" << U << " R=" << R << (causal ? " causal" : " document-only"));
      const RingPartition part(Documents(c.cu_seqlens, c.S), U, R);
      std::int64_t lo = c.S, hi = 0;
      for (int j = 0; j < R; ++j) lo = std::min(lo, part.ring_length(j)), hi = std::max(hi, part.ring_length(j));
      CHECK(hi > lo);  // the plans of the ring groups have different S (the documents' fingerprint carries the agreement)
      std::atomic<int> steps{0}, wrong{0};
      check_masks(c, steps, wrong);
      const rd::RingGlobals g(c);
      const auto res = rd::run_ring_attention(c, g, true);
      CHECK(wrong.load() == 0);
      CHECK(rd::max_errors(c, rd::RingReference(c, g, true), res).max() < 2e-5);
    }
}

TEST_CASE("U x AG: Ulysses across, k|v all-gathered over the ring ranks; one sequence and packed documents, GQA and MQA, uneven meshes; within 2e-5 of the reference") {
  struct Mesh2 {
    int U, R;
    std::int64_t H, Hkv;
  };
  for (const Mesh2& m : {Mesh2{2, 2, 4, 2}, Mesh2{2, 3, 6, 1}, Mesh2{3, 2, 6, 3}, Mesh2{4, 2, 4, 2}})
    for (bool causal : {true, false})
      for (bool docs : {false, true}) {
        rd::RingCase c;
        c.U = m.U, c.R = m.R, c.S = docs ? 41 : 36, c.H = m.H, c.Hkv = m.Hkv, c.D = 8, c.Dv = 8, c.B = 1, c.causal = causal;
        c.ulysses_allgather = true;
        if (docs) c.cu_seqlens = {0, 1, 1, 13, 41};
        INFO("U=" << m.U << " x AG R=" << m.R << " H=" << m.H << " Hkv=" << m.Hkv << (causal ? " causal" : " full") << (docs ? " packed documents" : ""));
        std::atomic<int> steps{0}, wrong{0};
        check_masks(c, steps, wrong);
        const rd::RingGlobals g(c);
        const auto res = rd::run_ring_attention(c, g, true);
        CHECK(steps.load() > 0);
        CHECK(steps.load() <= m.U * m.R);  // one step a rank (none where the mask leaves a rank nothing)
        if (docs || causal) CHECK(wrong.load() == 0);
        CHECK(rd::max_errors(c, rd::RingReference(c, g, true), res).max() < 2e-5);
        // The same bits on every run (the reduce-scatter's fixed order, the Ulysses sum's).
        const auto again = rd::run_ring_attention(c, g, true);
        for (std::size_t w = 0; w < res.size(); ++w) {
          CHECK(same_bits(res[w].out, again[w].out));
          CHECK(same_bits(res[w].dk, again[w].dk));
          CHECK(same_bits(res[w].dv, again[w].dv));
        }
      }
}

TEST_CASE("U x AG errors: the Ulysses-only overloads refuse it, forward and backward (the backward's would skip the reduce-scatter); a rank that rotates where the others gather is plan_mismatch on every rank") {
  const int U = 2, R = 2;
  const std::int64_t S = 24;
  const AttentionSpecs specs = attention_specs<float>(U, {4, 2, 8});
  std::vector<Errc> plain(4), plain_bwd(4), mixed(4);
  LocalMesh(U, R, std::chrono::seconds(30)).spawn([&](int w, LocalGroup::Comm& uc, LocalGroup::Comm& rc) {
    const RingPlan rp(RingPartition(S, U, R, RingLayout::zigzag), Mesh(4, U, R, 4), w, 1, specs, true);
    const DistributedAttentionPlan ag = DistributedAttentionPlan::allgather(rp);
    CHECK(ag.is_allgather());
    CHECK(ag.is_ulysses_allgather());
    CHECK(ag.steps() == 1);
    CHECK(ag.gather_plan().degree() == R);
    std::vector<float> x(1 << 12);
    std::vector<std::byte> b(1 << 16);
    plain[static_cast<std::size_t>(w)] =
        ut::code_of([&] { distributed_attention(ag, uc, QkvIn().q(x).k(x).v(x), ByteSpan(x), rd::step_attention, b, b); });
    plain_bwd[static_cast<std::size_t>(w)] = ut::code_of(
        [&] { distributed_attention_backward(ag, uc, ConstByteSpan(x), QkvGradOut().dq(x).dk(x).dv(x), rd::step_backward, b, b); });
    const DistributedAttentionPlan rot(rp);
    const DistributedAttentionPlan& mine = w == 3 ? rot : ag;  // world rank 3 rotates
    std::vector<std::byte> saved(std::max(ag.saved_bytes(), rot.saved_bytes())),
        ws(std::max(ag.forward_workspace_bytes(), rot.forward_workspace_bytes()));
    mixed[static_cast<std::size_t>(w)] =
        ut::code_of([&] { distributed_attention(mine, uc, rc, QkvIn().q(x).k(x).v(x), ByteSpan(x), rd::step_attention, saved, ws); });
  });
  for (int w = 0; w < 4; ++w) CHECK(plain[static_cast<std::size_t>(w)] == Errc::comm_mismatch);
  for (int w = 0; w < 4; ++w) CHECK(plain_bwd[static_cast<std::size_t>(w)] == Errc::comm_mismatch);
  for (int w = 0; w < 4; ++w) CHECK(mixed[static_cast<std::size_t>(w)] == Errc::plan_mismatch);
}

namespace {
/// Every world rank's shard of one result (RingRankResult member m) gathered to the global tensor.
std::vector<float> gathered(const rd::RingCase& c, const std::vector<rd::RingRankResult>& rs, std::vector<float> rd::RingRankResult::*m,
                            std::int64_t Hx, std::int64_t Dx) {
  std::vector<std::vector<float>> shards;
  for (const rd::RingRankResult& r : rs) shards.push_back(r.*m);
  return gather(rd::world_partition(c), c.B, Hx, Dx, shards);
}
}  // namespace

TEST_CASE("row transforms (RoPE): the bits of the call on q and k rotated before it, dq and dk by the inverse after it, by global token on every plan (plain Ulysses, U x R zigzag, contiguous and packed documents, bands, U x AG; GQA, MQA)") {
  struct Variant {
    int U, R, bands, layout;  // layout: 0 causal zigzag, 1 causal contiguous, 2 non-causal, 3 packed documents
    bool ulysses_allgather;
    std::int64_t H, Hkv;
  };
  for (const Variant v : {Variant{2, 1, 1, 0, false, 4, 2}, Variant{4, 1, 3, 2, false, 8, 2}, Variant{2, 2, 1, 0, false, 4, 1},
                          Variant{2, 2, 1, 1, false, 6, 2}, Variant{2, 2, 2, 3, false, 8, 4}, Variant{2, 2, 2, 0, false, 8, 1},
                          Variant{1, 4, 1, 0, false, 4, 4}, Variant{2, 2, 1, 0, true, 4, 1}, Variant{2, 2, 1, 3, true, 8, 2}}) {
    INFO("U=" << v.U << " R=" << v.R << " bands=" << v.bands << " layout " << v.layout << " U x AG " << v.ulysses_allgather << " H=" << v.H
              << " Hkv=" << v.Hkv);
    rd::RingCase c;
    c.U = v.U, c.R = v.R, c.S = 23, c.H = v.H, c.Hkv = v.Hkv, c.B = 2, c.D = 8, c.Dv = 4, c.bands = v.bands;
    c.ulysses_allgather = v.ulysses_allgather;
    c.causal = v.layout != 2;
    c.layout = v.layout == 1 ? RingLayout::contiguous : RingLayout::zigzag;
    if (v.layout == 3) c.cu_seqlens = std::vector<std::int64_t>{0, 9, 9, 23};
    const rd::RingGlobals g(c);
    const auto want = rd::run_ring_attention(c, rd::rope_globals(c, g), true);  // a RoPE pass of its own, then the call
    rd::RingCase cr = c;
    cr.rope = true;
    const auto got = rd::run_ring_attention(cr, g, true);  // RoPE fused into the exchanges
    for (std::size_t w = 0; w < got.size(); ++w) {
      CHECK(same_bits(got[w].out, want[w].out));
      CHECK(same_bits(got[w].lse, want[w].lse));
      CHECK(same_bits(got[w].dv, want[w].dv));
    }
    std::vector<float> dq = gathered(c, want, &rd::RingRankResult::dq, c.H, c.D), dk = gathered(c, want, &rd::RingRankResult::dk, c.Hkv, c.D);
    rd::rope_rows(c, dq, c.H, true);  // (the backward of the separate pass: its inverse)
    rd::rope_rows(c, dk, c.Hkv, true);
    CHECK(same_bits(gathered(cr, got, &rd::RingRankResult::dq, c.H, c.D), dq));
    CHECK(same_bits(gathered(cr, got, &rd::RingRankResult::dk, c.Hkv, c.D), dk));
    // The rotation mattered: without it the output differs.
    const auto unrotated = rd::run_ring_attention(c, g, false);
    CHECK_FALSE(same_bits(gathered(c, unrotated, &rd::RingRankResult::out, c.H, c.Dv), gathered(c, got, &rd::RingRankResult::out, c.H, c.Dv)));
  }
}

TEST_CASE("a tensor given as a range of another element size (q or o in doubles for a float32 plan, dq in uint16): tensor_mismatch on that rank before any data moves, aborted on its peers; plain Ulysses and all-gather KV (whose q and o skip the exchanges' check)") {
  const int P = 4;
  const std::int64_t S = 24;
  const AttentionSpecs specs = attention_specs<float>(1, {4, 2, 8});  // all-gather KV's (every head on every rank)
  for (int kind = 0; kind < 2; ++kind)
    for (int which = 0; which < 3; ++which) {  // q, o (forward), dq (backward)
      CAPTURE(kind);
      CAPTURE(which);
      std::vector<std::pair<Errc, std::string>> errs(P);
      auto no_attention = [](const AttentionStep&) {};  // (only the checks matter here)
      auto no_backward = [](const AttentionGradStep&) {};
      const auto t0 = std::chrono::steady_clock::now();
      LocalGroup(P, std::chrono::seconds(30)).spawn([&](LocalGroup::Comm& comm) {
        const int w = comm.rank();
        const DistributedAttentionPlan p = kind == 0 ? DistributedAttentionPlan({P, w}, 1, SeqPartition::balanced(S, P), attention_specs<float>(P, {4, 2, 8}), true)
                                                     : DistributedAttentionPlan::allgather({P, w}, 1, SeqPartition::balanced(S, P), specs, true, nullptr);
        std::vector<float> x(1 << 12), o(1 << 12), dk(1 << 12), dv(1 << 12);
        std::vector<double> x8(1 << 11);
        std::vector<std::uint16_t> x2(1 << 13);
        std::vector<std::byte> saved(p.saved_bytes()), ws(std::max(p.forward_workspace_bytes(), p.backward_workspace_bytes()));
        const bool bad = w == 1;
        errs[static_cast<std::size_t>(w)] = ut::error_of([&] {
          if (which < 2) {
            const QkvIn in = bad && which == 0 ? QkvIn().q(x8).k(x).v(x) : QkvIn().q(x).k(x).v(x);
            distributed_attention(p, comm, in, bad && which == 1 ? ByteSpan(x8) : ByteSpan(o), no_attention, saved, ws);
          } else {
            distributed_attention(p, comm, QkvIn().q(x).k(x).v(x), ByteSpan(o), no_attention, saved, ws);
            const QkvGradOut g = bad ? QkvGradOut().dq(x2).dk(dk).dv(dv) : QkvGradOut().dq(x).dk(dk).dv(dv);
            distributed_attention_backward(p, comm, ConstByteSpan(o), g, no_backward, saved, ws);
          }
        });
      });
      for (int w = 0; w < P; ++w) {
        CAPTURE(w);
        CAPTURE(errs[static_cast<std::size_t>(w)].second);
        CHECK(errs[static_cast<std::size_t>(w)].first == (w == 1 ? Errc::tensor_mismatch : Errc::aborted));
      }
      const char* name = which == 0 ? "distributed_attention: q was given" : which == 1 ? "distributed_attention: o was given" : "distributed_attention_backward: dq was given";
      CHECK(errs[1].second.find(name) != std::string::npos);
      CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));  // the peers heard at once (the deadline is 30 s)
    }
}

TEST_CASE("row transforms: an all-gather-KV plan (no seq->head to run them in) refuses them on every rank, before any data moves") {
  const int P = 4;
  const std::int64_t S = 24;
  const AttentionSpecs specs = attention_specs<float>(1, {4, 2, 8});
  const Rope rope(8, S);
  std::vector<Errc> fwd(P), bwd(P);
  LocalGroup(P, std::chrono::seconds(30)).spawn([&](LocalGroup::Comm& comm) {
    const int w = comm.rank();
    const DistributedAttentionPlan ag = DistributedAttentionPlan::allgather({P, w}, 1, SeqPartition::balanced(S, P), specs, true, nullptr);
    std::vector<float> x(1 << 12);
    std::vector<std::byte> saved(ag.saved_bytes()), ws(std::max(ag.forward_workspace_bytes(), ag.backward_workspace_bytes()));
    const RowTransforms tx = RowTransforms().on_pack(0, rope);
    fwd[static_cast<std::size_t>(w)] =
        ut::code_of([&] { distributed_attention(ag, comm, QkvIn().q(x).k(x).v(x), ByteSpan(x), rd::step_attention, saved, ws, tx); });
    bwd[static_cast<std::size_t>(w)] = ut::code_of([&] {
      distributed_attention_backward(ag, comm, ConstByteSpan(x), QkvGradOut().dq(x).dk(x).dv(x), rd::step_backward, saved, ws, tx);
    });
  });
  for (int w = 0; w < P; ++w) CHECK(fwd[static_cast<std::size_t>(w)] == Errc::invalid_shape);
  for (int w = 0; w < P; ++w) CHECK(bwd[static_cast<std::size_t>(w)] == Errc::invalid_shape);
}

TEST_CASE("seq_format: the engine's seq-sharded tensors in sbhd or bhsd give the bshd bits, forward and backward (plain Ulysses, U x R zigzag, packed documents, bands, U x AG, RoPE; GQA, MQA); an all-gather-KV plan refuses it") {
  struct Variant {
    int U, R, bands, layout;  // layout: 0 causal zigzag, 2 non-causal, 3 packed documents
    bool ulysses_allgather, rope;
    std::int64_t H, Hkv;
  };
  for (const Format f : {Format::sbhd, Format::bhsd})
    for (const Variant v : {Variant{4, 1, 2, 2, false, false, 8, 2}, Variant{2, 2, 1, 0, false, false, 4, 1}, Variant{2, 2, 2, 3, false, true, 8, 4},
                            Variant{1, 4, 1, 0, false, true, 4, 4}, Variant{2, 2, 1, 0, true, false, 4, 2}}) {
      INFO(to_string(f) << " U=" << v.U << " R=" << v.R << " bands=" << v.bands << " layout " << v.layout << " U x AG " << v.ulysses_allgather
                        << " rope " << v.rope);
      rd::RingCase c;
      c.U = v.U, c.R = v.R, c.S = 23, c.H = v.H, c.Hkv = v.Hkv, c.B = 2, c.D = 8, c.Dv = 4, c.bands = v.bands;
      c.ulysses_allgather = v.ulysses_allgather, c.rope = v.rope;
      c.causal = v.layout != 2;
      if (v.layout == 3) c.cu_seqlens = std::vector<std::int64_t>{0, 9, 9, 23};
      const rd::RingGlobals g(c);
      const auto want = rd::run_ring_attention(c, g, true);
      rd::RingCase cf = c;
      cf.seq_format = f;
      const auto got = rd::run_ring_attention(cf, g, true);
      for (std::size_t w = 0; w < got.size(); ++w) check_same_results(got[w], want[w]);
    }
  const AttentionSpecs specs = attention_specs<float>(1, {4, 2, 8});
  DistributedAttentionOptions o;
  o.seq_format = Format::sbhd;
  const auto [code, what] = ut::error_of([&] { (void)DistributedAttentionPlan::allgather({2, 0}, 1, SeqPartition::balanced(16, 2), specs, true, nullptr, o); });
  CHECK(code == Errc::invalid_shape);
  CHECK(what.find("seq_format = sbhd") != std::string::npos);
}

TEST_CASE("row transforms: a transform for a tensor not planned by rows, or outside q, k, v, is refused in the attention's terms on every rank") {
  const int P = 2;
  const std::int64_t S = 16;
  const AttentionSpecs specs = attention_specs<float>(P, {4, 2, 8});  // (q, k, v not planned by rows)
  const Rope rope(8, S);
  std::vector<std::pair<Errc, std::string>> fwd(P), bwd(P), bad(P);
  LocalGroup(P, std::chrono::seconds(30)).spawn([&](LocalGroup::Comm& comm) {
    const int w = comm.rank();
    const DistributedAttentionPlan plan({P, w}, 1, SeqPartition::balanced(S, P), specs, true);
    std::vector<float> x(1 << 12);
    std::vector<std::byte> saved(plan.saved_bytes()), ws(std::max(plan.forward_workspace_bytes(), plan.backward_workspace_bytes()));
    const auto W = static_cast<std::size_t>(w);
    fwd[W] = ut::error_of([&] {
      distributed_attention(plan, comm, QkvIn().q(x).k(x).v(x), ByteSpan(x), rd::step_attention, saved, ws, RowTransforms().on_pack(1, rope));
    });
    bwd[W] = ut::error_of([&] {
      distributed_attention_backward(plan, comm, ConstByteSpan(x), QkvGradOut().dq(x).dk(x).dv(x), rd::step_backward, saved, ws,
                                     RowTransforms().on_unpack(0, rope));
    });
    bad[W] = ut::error_of([&] {
      distributed_attention(plan, comm, QkvIn().q(x).k(x).v(x), ByteSpan(x), rd::step_attention, saved, ws, RowTransforms().on_pack(3, rope));
    });
  });
  for (int w = 0; w < P; ++w) {
    const auto W = static_cast<std::size_t>(w);
    CHECK(fwd[W].first == Errc::invalid_shape);
    CHECK(fwd[W].second.find("distributed_attention: a row transform was given for k (tensor 1)") != std::string::npos);
    CHECK(fwd[W].second.find("specs.k.with_row_transforms()") != std::string::npos);
    CHECK(bwd[W].first == Errc::invalid_shape);
    CHECK(bwd[W].second.find("distributed_attention_backward: a row transform was given for dq (tensor 0)") != std::string::npos);
    CHECK(bad[W].first == Errc::invalid_shape);
    CHECK(bad[W].second.find("tensor 3; the tensors are 0, 1, 2 (q, k, v)") != std::string::npos);
  }
}
