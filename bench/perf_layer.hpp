// SPDX-License-Identifier: Apache-2.0
// ulysses_perf --op layer --layer U,R[,ring|allgather] (--backend mpi): one attention layer's
// forward, distributed_attention() (attention/distributed.hpp) as an engine calls it, on a
// U × R × outer mesh of the MPI world (Mesh: U inside a node first, ring ranks U apart, the outer
// groups data parallel, all of them at once), around a stand-in attention: each step's call
// sleeps for its pairs' FLOPs (2 · B · heads · AttentionStep::work.pairs() · (D + Dv)) at
// --attn-TFLOPS (a simulated sleep under SMPI: bench/band_bench.hpp's stand_in()). Packed
// documents with --docs (the per-document zigzag: RingPartition(Documents, U, R) for the ring,
// documents_partition(..., zigzag) over the R ranks for the all-gather; plain Ulysses: the
// contiguous split, SeqPartition::balanced, and the plan's documents). R = 1: plain Ulysses over
// U; kv `allgather`: U = 1 the drop-in's all-gather KV over the R ranks (q stays), U > 1 U × AG
// (DistributedAttentionPlan::allgather(const RingPlan&): Ulysses across, k|v gathered over R).
// --bands G,...: each size once per band count (DistributedAttentionOptions::bands: the forward's
// exchanges of one band hidden behind the attention of the next; with R > 1 each band's k|v rotates
// as its own block), a column G at the end; not with kv `allgather`. --progress reaches every plan.
//
// Columns: time = the median over iterations of the slowest rank's call; attn = the balanced
// attention (the layer's pairs FLOPs / (U · R) ranks / rate: what one rank must compute at
// least); added = time − attn, what the layout adds to the attention (what advise_hybrid()
// prices: HybridChoice::seconds), and its prediction from the model of --params (the row of
// advise_hybrid() with the same U, R and kv, the same documents; -- without --params: the
// placeholders of CostModel::nvlink_infiniband()). -c 0: the buffers' contents are never read
// (memory folding under SMPI: ULYSSES_SMPI_FOLD_BYTES).
#pragma once

#include <ulysses/attention/distributed.hpp>
#include <ulysses/comm/mpi.hpp>
#include <ulysses/tune/ring_cost.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "band_bench.hpp"
#include "perf_documents.hpp"

namespace perf_layer {

using namespace ulysses;

/// --layer U,R[,KV].
struct Layout {
  int U = 1, R = 1;
  RingKv kv = RingKv::none;
};

/// Parses --layer's argument; exits (2) on a malformed one.
inline Layout parse(const std::string& s) {
  Layout l;
  char kv[32] = {0};
  const int n = std::sscanf(s.c_str(), "%d,%d,%31s", &l.U, &l.R, kv);
  const std::string k = kv;
  if (n < 2 || l.U < 1 || l.R < 1 || (n == 3 && k != "ring" && k != "allgather" && k != "none")) {
    std::fprintf(stderr, "--layer takes U,R[,ring|allgather] (U, R >= 1; default ring when R > 1), not '%s'\n", s.c_str());
    std::exit(2);
  }
  l.kv = l.R == 1 ? RingKv::none : k == "allgather" ? RingKv::allgather : RingKv::rotation;  // (U x AG for U > 1)
  if ((l.R == 1) != (l.kv == RingKv::none)) {
    std::fprintf(stderr, "--layer %s: R = 1 is plain Ulysses (no kv strategy)\n", s.c_str());
    std::exit(2);
  }
  return l;
}

/// One size's line.
struct Line {
  std::int64_t S = 0;
  int G = 1;  // head bands
  double us = 0, attn_us = 0, predicted_us = -1;
};

/// The layer's plan on world rank w (see the file comment).
inline DistributedAttentionPlan plan_of(const Layout& l, const Mesh& mesh, int w, std::int64_t B, std::int64_t S, const AttentionShape& shape,
                                        const Documents* docs, int bands = 1, Progress progress = Progress::automatic) {
  const AttentionSpecs specs = attention_specs<std::uint16_t>(l.U, shape, ElementType::bfloat16);
  if (l.kv == RingKv::allgather && l.U == 1) {  // all-gather KV over the R ranks
    const int j = mesh.ring_rank(w);
    const SeqPartition seq = docs ? documents_partition(*docs, l.R, DocumentSplit::zigzag) : SeqPartition::zigzag(S, l.R);
    return DistributedAttentionPlan::allgather({l.R, j}, B, seq, specs, true, docs);
  }
  if (l.R == 1) {
    const Group g{l.U, mesh.ulysses_rank(w)};
    // (every rank attends all S tokens: any split balances; the contiguous one moves the fewest pieces)
    DistributedAttentionOptions opt;
    opt.bands = bands;
    opt.progress = progress;  // (--progress: how the band pipeline's exchanges move during a band's attention)
    return docs ? DistributedAttentionPlan(g, B, SeqPartition::balanced(S, l.U), specs, true, *docs, opt)
                : DistributedAttentionPlan(g, B, SeqPartition::balanced(S, l.U), specs, true, opt);
  }
  const RingPartition part = docs ? RingPartition(*docs, l.U, l.R) : RingPartition(S, l.U, l.R, RingLayout::zigzag);
  const RingPlan rp(part, mesh, w, B, specs, true);
  DistributedAttentionOptions opt;
  opt.bands = bands;
  opt.progress = progress;
  return l.kv == RingKv::allgather ? DistributedAttentionPlan::allgather(rp, opt) : DistributedAttentionPlan(rp, opt);  // U x AG, or the rotation
}

/// --op layer over `world` (MpiComm of MPI_COMM_WORLD): the sweep's sizes, each timed; rank 0
/// prints the table. `model` prices the prediction. Collective. @returns the exit status.
template <class O, class Next>
int run_mpi(MpiComm& world, const O& o, const Layout& l, const CostModel& model, bool model_given, Next&& next) {
  const int W = world.size(), w = world.rank();
  const int rpn = o.ranks_per_node > 0 ? o.ranks_per_node : std::min(W, 8);
  if (W % (l.U * l.R) != 0) {
    if (w == 0) std::fprintf(stderr, "--layer %d,%d: U x R must divide the %d ranks\n", l.U, l.R, W);
    return 2;
  }
  if (o.bands_given && l.kv == RingKv::allgather) {
    if (w == 0) std::fprintf(stderr, "--op layer --bands: head bands run on plain Ulysses and on the ring rotation, not with kv allgather\n");
    return 2;
  }
  const std::vector<int> band_counts = o.bands_given ? o.bands : std::vector<int>{1};
  const Mesh mesh(W, l.U, l.R, rpn);
  MPI_Comm ucomm = MPI_COMM_NULL, rcomm = MPI_COMM_NULL;
  MPI_Comm_split(world.get(), mesh.ulysses_group(w), mesh.ulysses_rank(w), &ucomm);
  MPI_Comm_split(world.get(), mesh.ring_group(w), mesh.ring_rank(w), &rcomm);
  std::vector<Line> lines;
  {
    MpiComm uc(ucomm), rc(rcomm);
    const AttentionShape& shape = o.shape;
    const std::int64_t B = o.batch, Dv = shape.v_head_dim ? shape.v_head_dim : shape.head_dim;
    const double rate = o.attn_TFLOPS * 1e12;
    for (std::int64_t S = o.docs.fixed_seq_len() ? o.docs.fixed_seq_len() : o.begin; S > 0; S = o.docs.fixed_seq_len() ? 0 : next(S)) {
      std::optional<Documents> docs;
      if (o.docs.given) docs = perf_documents::documents(o.docs, S);
      for (const int G : band_counts) {
        const DistributedAttentionPlan plan = plan_of(l, mesh, w, B, S, shape, docs ? &*docs : nullptr, G, o.progress);
        const bool ag = plan.is_allgather() && !plan.is_ulysses_allgather();  // (U = 1: q stays, no o plan)
        const std::size_t e = 2;  // bf16
        const std::size_t q_bytes = ag ? static_cast<std::size_t>(B * plan.tokens() * plan.query_heads() * shape.head_dim) * e : plan.qkv_plan().seq_bytes(0);
        const std::size_t k_bytes = plan.qkv_plan().seq_bytes(ag ? 0 : 1), v_bytes = plan.qkv_plan().seq_bytes(ag ? 1 : 2);
        const std::size_t o_bytes = ag ? static_cast<std::size_t>(B * plan.tokens() * plan.query_heads() * Dv) * e : plan.out_plan().seq_bytes(0);
        std::vector<std::byte> q(q_bytes), k(k_bytes), v(v_bytes), out(o_bytes), saved(plan.saved_bytes()), ws(plan.forward_workspace_bytes());
        const auto attention = [&](const AttentionStep& st) {
          const double flops = 2.0 * static_cast<double>(st.batch * st.heads.q_count) * static_cast<double>(st.work.pairs()) *
                               static_cast<double>(st.head_dim + st.v_head_dim);
          band_bench::stand_in(flops / rate, "sleep");
        };
        const auto call = [&] {
          if (l.R > 1 && !ag)
            distributed_attention(plan, uc, rc, QkvIn().q(q).k(k).v(v), ByteSpan(out), attention, ByteSpan(saved), Workspace(ws));
          else
            distributed_attention(plan, ag ? rc : uc, QkvIn().q(q).k(k).v(v), ByteSpan(out), attention, ByteSpan(saved), Workspace(ws));
        };
        std::vector<double> t;
        for (int i = 0; i < o.warmup + o.iters; ++i) {
          MPI_Barrier(world.get());
          const double t0 = MPI_Wtime();
          call();
          double dt = MPI_Wtime() - t0, slowest = 0;
          MPI_Allreduce(&dt, &slowest, 1, MPI_DOUBLE, MPI_MAX, world.get());
          if (i >= o.warmup) t.push_back(slowest);
        }
        std::sort(t.begin(), t.end());
        Line line;
        line.S = S;
        line.G = G;
        line.us = t[t.size() / 2] * 1e6;
        const double Sd = static_cast<double>(S), pairs = docs ? static_cast<double>(docs->causal_pairs()) : Sd * (Sd + 1) / 2;
        line.attn_us = 2.0 * static_cast<double>(B * shape.num_heads) * pairs * static_cast<double>(shape.head_dim + Dv) /
                       (static_cast<double>(l.U * l.R) * rate) * 1e6;
        if (w == 0) {
          const std::vector<HybridChoice> rows = advise_hybrid(shape, S, W, rpn, model, rate, true, ElementType::bfloat16, B, HeadPolicy::even, 0,
                                                               docs ? &*docs : nullptr);
          for (const HybridChoice& h : rows)
            if (h.ulysses_degree == l.U && h.ring_degree == l.R && h.kv == l.kv) line.predicted_us = h.seconds * 1e6;
        }
        lines.push_back(line);
      }
    }
  }
  MPI_Comm_free(&ucomm);
  MPI_Comm_free(&rcomm);
  if (w == 0) {
    std::printf("# ulysses_perf --op layer: distributed_attention() forward, %s (H=%lld Hkv=%lld D=%lld), bf16, B=%lld, causal, %s;\n"
                "# mesh U=%d x R=%d x outer=%d of %d ranks (%d a node), kv %s; stand-in attention at %.4g TFLOP/s; %d iters after %d warm-up\n"
                "# time: the median of the slowest rank's call; attn: the balanced attention (the layer's FLOPs / (U R) / rate);\n"
                "# added = time - attn; predicted: advise_hybrid()'s time of the same row (%s); ratio = predicted / added\n",
                o.model.c_str(), static_cast<long long>(o.shape.num_heads), static_cast<long long>(o.shape.num_kv_heads),
                static_cast<long long>(o.shape.head_dim), static_cast<long long>(o.batch), o.docs.describe().c_str(), l.U, l.R, W / (l.U * l.R), W,
                rpn, to_string(l.kv), o.attn_TFLOPS, o.iters, o.warmup, model_given ? "the --params model" : "CostModel::nvlink_infiniband()");
    if (o.bands_given) std::printf("# G: head bands (DistributedAttentionOptions::bands); predicted: the unbanded row's\n");
    std::printf("#%4s %5s %-9s %10s %10s %10s %10s %12s %7s%s\n", "U", "R", "kv", "S", "time(ms)", "attn(ms)", "added(ms)", "predicted(ms)", "ratio",
                o.bands_given ? "     G" : "");
    for (const Line& x : lines) {
      std::printf(" %4d %5d %-9s %10lld %10.3f %10.3f %10.3f %12.3f %7.3f", l.U, l.R, to_string(l.kv), static_cast<long long>(x.S), x.us * 1e-3,
                  x.attn_us * 1e-3, (x.us - x.attn_us) * 1e-3, x.predicted_us * 1e-3,
                  x.predicted_us >= 0 ? x.predicted_us / (x.us - x.attn_us) : 0.0);
      if (o.bands_given) std::printf(" %5d", x.G);
      std::printf("\n");
    }
  }
  return 0;
}

}  // namespace perf_layer
