// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief A decode plan's inputs (DecodeFields): the spec and rank, validated (every error
///        depends only on inputs all ranks share, except a rank's own layouts), the layouts
///        resolved. DecodePlan derives from it (decode/plan.hpp); docs/decode.md, "Errors".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "../../detail/checked.hpp"
#include "../../error.hpp"
#include "../spec.hpp"

ULYSSES_NAMESPACE_BEGIN

namespace detail {

/// The validated inputs of a DecodePlan. Made once by the DecodePlan constructor.
class DecodeFields {
 public:
  /// Validates `spec` for rank `rank` and resolves its layouts (DecodePlan's constructor documents
  /// the errors).
  DecodeFields(DecodeSpec spec, int rank) : spec_(std::move(spec)), rank_(rank) {
    validate_global();
    const std::int64_t B = spec_.batch, T = spec_.tokens, H = spec_.heads.num_heads(), Dv = spec_.head_dim_v;
    const std::int64_t Ho = spec_.output == DecodeOutput::all_heads ? H : spec_.heads.count(rank_);
    resolve(spec_.partial_layout, Layout::bshd(B, T, H, Dv), "the partial output O_r", true);
    resolve(spec_.lse_layout, lse_layout_bth(B, T, H), "the partial LSE_r", false);
    resolve(spec_.out_layout, Layout::bshd(B, T, Ho, Dv), "the merged output", true);
    resolve(spec_.out_lse_layout, lse_layout_bth(B, T, Ho), "the merged LSE", false);
  }

 protected:
  DecodeSpec spec_;  // layouts resolved
  int rank_ = 0;

 private:
  /// The checks of inputs every rank shares: group, shape, head split, path, types, byte counts.
  void validate_global() {
    const int P = spec_.heads.degree();
    check_group_size(P);
    check_rank(rank_, P);
    const std::int64_t H = spec_.heads.num_heads();
    auto positive = [](std::int64_t v, const char* what) {
      if (v < 1) fail(Errc::invalid_shape, std::string(what) + "=" + std::to_string(v) + " must be >= 1");
    };
    positive(spec_.batch, "decode batch B");
    positive(spec_.tokens, "decode tokens T");
    positive(H, "decode heads H (DecodeSpec::heads)");
    positive(spec_.head_dim_v, "decode head dim Dv");
    if (!spec_.heads.disjoint())
      fail(Errc::invalid_partition, "decode head ranges " + spec_.heads.str() +
                                        " overlap; each head is merged by one rank: use HeadPartition::even or balanced");
    if (spec_.path == Path::direct && P > kMaxTableRanks)
      fail(Errc::path_unsupported, "Path::direct takes decode groups of up to " + std::to_string(kMaxTableRanks) +
                                       " ranks; this one has " + std::to_string(P) + ": use Path::automatic");
    for (ElementType t : {spec_.partial_type, spec_.out_type})
      if (!mergeable(t))
        fail(Errc::not_summable, std::string("decode element type ") + to_string(t) +
                                     " cannot be merged; partial and merged outputs are float32, float16 or bfloat16");
    // Byte counts of the largest tensors: overflow-checked once here.
    const std::int64_t rows = mul(mul(spec_.batch, spec_.tokens, "B*T"), H, "B*T*H");
    mul(mul(rows, spec_.head_dim_v, "B*T*H*Dv"), 4, "decode bytes");
  }

  /// Checks a given layout against the expected extents (or takes the default).
  static void resolve(std::optional<Layout>& l, const Layout& dflt, const char* what, bool rows) {
    if (!l) {
      l = dflt;
      return;
    }
    for (int i = 0; i < 4; ++i)
      if (l->extent[i] != dflt.extent[i])
        fail(Errc::layout_mismatch, std::string("the layout of ") + what + " is " + l->str() + "; its extents must be [" +
                                        std::to_string(dflt.extent[0]) + "," + std::to_string(dflt.extent[1]) + "," +
                                        std::to_string(dflt.extent[2]) + "," + std::to_string(dflt.extent[3]) + "]");
    if (!l->is_injective())
      fail(Errc::layout_aliasing, std::string("the layout of ") + what + " " + l->str() + " maps two elements to one address or has negative strides");
    if (rows && !l->rows_contiguous())
      fail(Errc::layout_mismatch, std::string("the layout of ") + what + " " + l->str() +
                                      " has a head dim that is not contiguous; decode layouts need stride 1 along d");
  }
};

}  // namespace detail

ULYSSES_NAMESPACE_END
