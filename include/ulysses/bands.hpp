// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Head bands (HeadBands) and the band pipeline (banded_attention(),
///        banded_attention_backward()): the exchange of one band hidden behind the engine's
///        attention of the next. A band is a stage of the layer's plans (PlanOptions::head_bands):
///        every rank's run of its local query heads, GQA groups whole; its head-side buffers are
///        the full buffers (allocation-stable). Same bits for every band count. docs/overlap.md.
///        Source: FlashInfer's head-chunk Ulysses (PR #5027), maxdiffusion's head-group chunks (#428).
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <string>
#include <utility>

#include "plan/attention.hpp"
#include "split_phase.hpp"

ULYSSES_NAMESPACE_BEGIN

/// One head band on this rank: the local heads (indices into this rank's head-sharded q and o,
/// resp. k and v, [0, H_r) resp. [0, Hkv_r)) whose attention the engine runs for it.
struct Band {
  int index = 0;     ///< g, in [0, HeadBands::count())
  HeadRun query;     ///< local query heads [lo, hi) (of q and o; empty when this rank has fewer heads than bands)
  HeadRun kv;        ///< local kv heads [lo, hi) those query heads use (of k and v)
};

namespace detail {
/// Band g of G of rank r of the layer `specs`: part g of r's query heads (stage_part()), and the
/// local kv heads they use. @throws Error(invalid_shape) g outside [0, G).
inline Band head_band(const AttentionSpecs& specs, int r, int g, int G) {
  if (g < 0 || g >= G) fail(Errc::invalid_shape, "HeadBands::band(" + std::to_string(g) + "): there are " + std::to_string(G) + " bands");
  const HeadRun part = stage_part(0, specs.query_heads.count(r), g, G);
  Band b{g, part, {0, 0}};
  if (part.size() > 0) b.kv = {specs.local_kv_head(r, part.lo), specs.local_kv_head(r, part.hi - 1) + 1};
  return b;
}
}  // namespace detail

/// The G head bands of one attention layer on one rank of a Ulysses group: the q, k, v plan and
/// the o plan of attention_specs() with PlanOptions::stages = G and head_bands, so that band g
/// is stage g of both. Band g of rank r is part g of r's query heads (the first H_r % G bands one
/// head longer: an uneven remainder is allowed), and the kv heads they use (seq→head sends a kv
/// head in the first band that uses it, head→seq of its gradient in the last band over its
/// holders that uses it; StageCut, partition/heads.hpp). Replicated kv heads (Hkv < P) are
/// handled: each holder receives its copy in its first band. Each band goes through the plans'
/// transports and their one agreement check; its head-side bytes land where the unbanded call
/// puts them. Every rank builds the same bands (part of the plans' agreement records).
class HeadBands {
 public:
  /// The bands of the layer `specs` (attention_specs(P, ...)) on `group` over `seq`, batch B.
  /// @param group   the Ulysses group (P ranks, this rank)
  /// @param batch   B >= 1
  /// @param seq     the sequence partition of the seq-sharded tensors
  /// @param specs   the layer's q, k, v, o specs (attention_specs(P, ...))
  /// @param bands   G in [1, kMaxStages]
  /// @param format  the local layouts' memory order (Format::bshd by default)
  /// @param options the plans' other options (stages and head_bands are set here)
  /// @throws Error(invalid_shape) G outside [1, kMaxStages]; what Plan() throws.
  HeadBands(Group group, std::int64_t batch, const SeqPartition& seq, const AttentionSpecs& specs, int bands,
            Format format = Format::bshd, PlanOptions options = {})
      : specs_(specs), qkv_(group, batch, seq, specs.qkv(), format, with_bands(options, bands)),
        out_(group, batch, seq, specs.out(), format, with_bands(options, bands)) {}

  int count() const { return qkv_.num_stages(); }       ///< G
  const Plan& qkv() const { return qkv_; }              ///< the q, k, v plan (stage g: band g)
  const Plan& out() const { return out_; }              ///< the o plan (stage g: band g)
  const AttentionSpecs& specs() const { return specs_; }  ///< the layer's specs

  /// Band g on this rank. @throws Error(invalid_shape) g outside [0, count()).
  Band band(int g) const { return detail::head_band(specs_, qkv_.rank(), g, count()); }

 private:
  static PlanOptions with_bands(PlanOptions o, int bands) {
    if (bands < 1 || bands > kMaxStages)
      detail::fail(Errc::invalid_shape, "HeadBands: " + std::to_string(bands) + " bands; give 1 to " + std::to_string(kMaxStages));
    o.stages = bands;
    o.head_bands = true;
    return o;
  }
  AttentionSpecs specs_;
  Plan qkv_, out_;
};

namespace detail {
/// The pipeline over G bands: `in(g)` and `out(g)` make band g's two exchanges, `band(g)` band g,
/// `work(band)` the engine's step. seq→head of band 0; then for each band g, one handle carrying seq→head of band
/// g + 1 and head→seq of band g − 1 around work(g); last head→seq of band G − 1. With G = 1 the
/// exchanges progress in start() whatever `progress` says (nothing to overlap).
template <class Comm, class Exec, class In, class Out, class BandOf, class Work>
void run_band_pipeline(int G, BandOf&& band_of, Comm& comm, Exec& exec, Progress progress, In&& in, Out&& out, Work&& work, const char* what) {
  // One band overlaps nothing: its exchanges run as the blocking calls do (no hand-over to a worker).
  Exchange<Comm, Exec> h(comm, exec, G == 1 ? Progress::in_start : progress);
  ExchangeCall calls[2];
  calls[0] = in(0);
  h.start(calls, 1);
  h.finish();
  for (int g = 0; g < G; ++g) {
    int n = 0;
    if (g + 1 < G) calls[n++] = in(g + 1);
    if (g > 0) calls[n++] = out(g - 1);
    if (n) h.start(calls, n);
    const Band b = band_of(g);
    std::exception_ptr failed;
    try {
      work(b);
    } catch (...) {
      failed = std::current_exception();
    }
    if (failed) {
      // Complete the exchange in flight before breaking the group: its worker may be inside the
      // communicator, which serves one thread at a time (MpiComm: MPI_THREAD_SERIALIZED, and its
      // failure state is unsynchronised). Then every rank's error, as break_group_on_failure().
      if (n) {
        try {
          h.finish();
        } catch (...) {  // (the group is broken already; the engine's error is the one to throw)
        }
      }
      break_group_on_failure(comm, what, [&] { std::rethrow_exception(failed); });
    }
    if (n) h.finish();
  }
  calls[0] = out(G - 1);
  h.start(calls, 1);
  h.finish();
}
}  // namespace detail

/// The forward of one attention layer over G head bands: seq→head of q, k, v band by band, the
/// engine's attention of band g while seq→head of band g + 1 and head→seq of band g − 1 move,
/// head→seq of o. The same bytes as seq_to_head(bands.qkv()), attention, head_to_seq(bands.out())
/// unbanded, for every G and every backend.
/// @param bands    the layer's bands (HeadBands) on this rank
/// @param comm     this rank's communicator of the group; every rank calls alike
/// @param exec     the executor of the copies (its memory the communicator's)
/// @param qkv_seq  this rank's seq-sharded q, k, v [B, S_r, H|Hkv, D|Dv] (bands.qkv()'s inputs)
/// @param qkv_head head-sharded q, k, v [B, S, H_r|Hkv_r, D|Dv]: filled band by band
/// @param qkv_ws   at least bands.qkv().workspace_bytes()
/// @param o_head   head-sharded o [B, S, H_r, Dv], which `attend` writes band by band
/// @param o_seq    seq-sharded o [B, S_r, H, Dv]: the result
/// @param o_ws     at least bands.out().workspace_bytes(), a workspace of its own (with G >= 2 a
///                 shared one is Error(buffer_overlap): the two exchanges are in flight together)
/// @param attend   `attend(const Band& b)`: the attention of b's local query heads (reading qkv_head's
///                 q heads b.query and k, v heads b.kv, which have arrived) into o_head's heads b.query
/// @param progress how the exchanges progress during `attend` (Progress; docs/overlap.md)
/// @param transforms row transforms of q, k, v's seq→head (tensors 0, 1, 2 of bands.qkv(), e.g.
///                 RoPE on pack; docs/transforms.md), band by band at each row's global token:
///                 the bits of seq_to_head(bands.qkv(), ..., transforms) unbanded. o's head→seq
///                 takes none. A tensor given one must be planned with_row_transforms().
/// @throws what the exchanges throw (Exchange::start(), finish(); a transform's refusal of its
///         rows or of its tensor's plan: Error(invalid_shape), before any byte moves); what
///         `attend` throws, after breaking the group (break_group_on_failure()), so that every
///         rank throws.
template <class Comm, class Exec, class Attend>
void banded_attention(const HeadBands& bands, Comm& comm, Exec& exec, const TensorList<ConstByteSpan>& qkv_seq,
                      const TensorList<ByteSpan>& qkv_head, Workspace qkv_ws, ConstByteSpan o_head, ByteSpan o_seq, Workspace o_ws,
                      Attend&& attend, Progress progress = Progress::automatic, const RowTransforms& transforms = {}) {
  // q, k, v's transforms are checked here, so that a refusal names this call (the pipeline meets
  // them in band 0's seq→head), every rank told of it.
  detail::tell_peers_on_failure(comm, comm.rank(), "banded_attention", [&] {
    BufferTable unused;
    detail::bind_transforms<Exec>(bands.qkv(), Direction::seq_to_head, &transforms, unused, "banded_attention");
  });
  detail::run_band_pipeline(
      bands.count(), [&](int g) { return bands.band(g); }, comm, exec, progress,
      [&](int g) {
        return ExchangeCall{&bands.qkv(), Direction::seq_to_head, qkv_seq, qkv_head, qkv_ws, StageRange::one(g), &transforms};
      },
      [&](int g) {
        return ExchangeCall{&bands.out(), Direction::head_to_seq, TensorList<ConstByteSpan>{o_head}, TensorList<ByteSpan>{o_seq}, o_ws,
                            StageRange::one(g)};
      },
      attend, "the attention of a head band");
}

/// The backward of banded_attention(): seq→head of do band by band, the engine's attention
/// backward of band g, head→seq of dq, dk, dv band by band (the partial gradients of a kv head
/// held by several ranks summed in ascending rank order, as seq_to_head_backward()). The same
/// bytes as the unbanded backward for every G, when the engine's per-band gradients of a kv head
/// add up as its unbanded kernel's do (e.g. accumulated in query-head order).
/// @param bands     the layer's bands (HeadBands) on this rank
/// @param comm      this rank's communicator of the group; every rank calls alike
/// @param exec      the executor of the copies (its memory the communicator's)
/// @param do_seq    seq-sharded do [B, S_r, H, Dv]
/// @param do_head   head-sharded do [B, S, H_r, Dv]: filled band by band
/// @param o_ws      at least bands.out().workspace_bytes(), not overlapping qkv_ws (as banded_attention())
/// @param dqkv_head head-sharded dq, dk, dv, which `attend_backward` writes: dq heads b.query;
///                  dk and dv heads b.kv, to which it adds its band's partials (zero them before)
/// @param dqkv_seq  seq-sharded dq, dk, dv: the result
/// @param qkv_ws    at least bands.qkv().workspace_bytes()
/// @param attend_backward `attend_backward(const Band& b)`
/// @param progress  how the exchanges progress during `attend_backward` (Progress)
/// @param transforms row transforms of dq, dk, dv's head→seq (e.g. the inverse RoPE on unpack,
///                  applied to the float32 sum of a replicated kv head's gradients): the bits of
///                  seq_to_head_backward(bands.qkv(), ..., transforms) unbanded. do's seq→head
///                  takes none.
/// @throws Error(not_adjoint) the q, k, v plan takes replicas from their owner; a refused
///         transform (as banded_attention()) before do moves or `attend_backward` runs; as
///         banded_attention().
template <class Comm, class Exec, class AttendBackward>
void banded_attention_backward(const HeadBands& bands, Comm& comm, Exec& exec, ConstByteSpan do_seq, ByteSpan do_head, Workspace o_ws,
                               const TensorList<ConstByteSpan>& dqkv_head, const TensorList<ByteSpan>& dqkv_seq, Workspace qkv_ws,
                               AttendBackward&& attend_backward, Progress progress = Progress::automatic,
                               const RowTransforms& transforms = {}) {
  detail::require_adjoint(bands.qkv(), "banded_attention_backward");
  // dq, dk, dv's transforms are checked before do's seq→head and the engine's attention backward
  // run (the pipeline meets them only at band 0's head→seq), every rank told of a refusal.
  detail::tell_peers_on_failure(comm, comm.rank(), "banded_attention_backward", [&] {
    BufferTable unused;
    detail::bind_transforms<Exec>(bands.qkv(), Direction::head_to_seq, &transforms, unused, "banded_attention_backward");
  });
  detail::run_band_pipeline(
      bands.count(), [&](int g) { return bands.band(g); }, comm, exec, progress,
      [&](int g) {
        return ExchangeCall{&bands.out(), Direction::seq_to_head, TensorList<ConstByteSpan>{do_seq}, TensorList<ByteSpan>{do_head}, o_ws,
                            StageRange::one(g)};
      },
      [&](int g) {
        return ExchangeCall{&bands.qkv(), Direction::head_to_seq, dqkv_head, dqkv_seq, qkv_ws, StageRange::one(g), &transforms};
      },
      attend_backward, "the attention backward of a head band");
}

ULYSSES_NAMESPACE_END
