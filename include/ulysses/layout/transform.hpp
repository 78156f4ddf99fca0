// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Row transforms fused into the block copy: RowCoord (where a row of D elements lies),
///        the row-transform concept and its loud check, RowTransforms (one call's transforms per
///        tensor, on pack and on unpack); the one-rounding load / store of a row in double around
///        them is detail/row_io.hpp.
///        Built-in transforms: Scale here, Rope in layout/rope.hpp. Notes: docs/transforms.md.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../detail/cpu.hpp"
#include "../detail/hash.hpp"
#include "blocks.hpp"
#include "detail/row_io.hpp"
#include "detail/row_lanes.hpp"
#include "element.hpp"

ULYSSES_NAMESPACE_BEGIN

/// Where one head row of D elements lies in the whole tensor: its batch index, its GLOBAL token
/// index (0 <= token < S, in the sequence's order, whichever rank holds it) and its GLOBAL head
/// index (0 <= head < H). The same on every path and rank for the same element.
struct RowCoord {
  std::int64_t batch = 0;  ///< b in [0, B)
  std::int64_t token = 0;  ///< global token index in [0, S)
  std::int64_t head = 0;   ///< global head index in [0, H)
};

/// A run of `count` head rows of n elements each that the executor hands a transform's fused
/// copy_run() at once: row i (0 <= i < count) is read at src + i·src_stride and written at
/// dst + i·dst_stride (strides in bytes), and lies at RowCoord first + i·step (step: the
/// per-row increment of batch, token and head; {0, 0, 1} along the heads of one token). Each
/// row's src and dst are the same row or disjoint, and the rows do not overlap one another.
struct RowRun {
  RowCoord first;                  ///< row 0's coordinates
  RowCoord step;                   ///< the coordinates' increment from one row to the next
  const std::byte* src = nullptr;  ///< row 0's elements, read
  std::int64_t src_stride = 0;     ///< bytes from one row's source to the next
  std::byte* dst = nullptr;        ///< row 0's destination, written
  std::int64_t dst_stride = 0;     ///< bytes from one row's destination to the next
  std::int64_t n = 0;              ///< elements a row (D)
  std::int64_t count = 0;          ///< rows
  /// Whether the executor streams this call's stores (a list larger than the caches; it fences
  /// after the call): the copy may store its rows with non-temporal stores. Same bits either way.
  bool stream = false;
  /// The first row of the run copied next where it starts a new stride (rows src_stride apart, at
  /// most `count`), else null: a hint, never read. A transform with `static constexpr bool
  /// prefetches_next_src = true` prefetches its row i in copying row i; else the executor does.
  const std::byte* next_src = nullptr;
  /// Row i's coordinates: first + i·step.
  RowCoord at(std::int64_t i) const { return {first.batch + i * step.batch, first.token + i * step.token, first.head + i * step.head}; }
};

namespace detail {
/// Whether X has `void operator()(const RowCoord&, double*, std::int64_t) const`.
template <class X, class = void>
struct has_row_call : std::false_type {};
template <class X>
struct has_row_call<X, std::void_t<decltype(std::declval<const X&>()(std::declval<const RowCoord&>(), std::declval<double*>(),
                                                                      std::declval<std::int64_t>()))>> : std::true_type {};
/// Whether X names an operator() at all (a mistyped one is then an error, not an absent transform).
template <class X, class = void>
struct names_call : std::false_type {};
template <class X>
struct names_call<X, std::void_t<decltype(&X::operator())>> : std::true_type {};
/// Whether X has the optional `void check_rows(std::int64_t B, std::int64_t S, std::int64_t D) const`.
template <class X, class = void>
struct has_check_rows : std::false_type {};
template <class X>
struct has_check_rows<X, std::void_t<decltype(std::declval<const X&>().check_rows(std::int64_t{}, std::int64_t{}, std::int64_t{}))>>
    : std::true_type {};
/// Whether X has the fused `bool copy_row(const RowCoord&, ElementType, const std::byte*, std::byte*, std::int64_t) const`.
template <class X, class = void>
struct has_copy_row : std::false_type {};
template <class X>
struct has_copy_row<X, std::void_t<decltype(bool{std::declval<const X&>().copy_row(std::declval<const RowCoord&>(), ElementType{},
                                                                                   std::declval<const std::byte*>(),
                                                                                   std::declval<std::byte*>(), std::int64_t{})})>>
    : std::true_type {};
/// Whether X has the optional run form `bool copy_run(const RowRun&, ElementType) const`.
template <class X, class = void>
struct has_copy_run : std::false_type {};
template <class X>
struct has_copy_run<X, std::void_t<decltype(bool{std::declval<const X&>().copy_run(std::declval<const RowRun&>(), ElementType{})})>>
    : std::true_type {};
/// Whether X's copy_run prefetches RowRun::next_src itself (`static constexpr bool prefetches_next_src`).
/// Whether X has the optional `std::uint64_t agreement_word() const` (what every rank's calls compare).
template <class X, class = void>
struct has_agreement_word : std::false_type {};
template <class X>
struct has_agreement_word<X, std::enable_if_t<std::is_same_v<decltype(std::declval<const X&>().agreement_word()), std::uint64_t>>>
    : std::true_type {};
template <class X, class = void>
struct prefetches_next_src : std::false_type {};
template <class X>
struct prefetches_next_src<X, std::enable_if_t<X::prefetches_next_src>> : std::true_type {};
}  // namespace detail

/// Compile-time check of a row-transform type X (the concept): X must be callable as
/// `void operator()(const RowCoord& at, double* row, std::int64_t n) const`, transforming the n
/// elements of one head row in place (n == D; the row's elements widened exactly to double; the
/// library rounds the result once to the tensor's element type). It must not throw, must be
/// safe to call from several threads at once (const, no shared mutable state), and must give the
/// same result for the same (at, row) on every call: every path and rank then writes the same
/// bits. It may also have the fused form `bool copy_row(const RowCoord& at, ElementType type,
/// const std::byte* src, std::byte* dst, std::int64_t n) const`, which loads, transforms and
/// stores a row in one pass with the same bits (Rope has one; RowTransformRef::copy), and the run
/// form `bool copy_run(const RowRun& run, ElementType type) const`, copy_row() over a RowRun of
/// rows in one call (RowTransformRef::copy_run: the executor prefers it, one call per run of
/// rows along a block's innermost loop). Each returns false, touching nothing, where it does not
/// fuse (a type, a row length; copy_run() also a run it declines): the executor then copies
/// those rows one by one (copy_row(), else the row path).
/// True when X passes; else a static_assert names what is wrong.
template <class X>
constexpr bool check_row_transform() {
  static_assert(detail::names_call<X>::value || detail::has_row_call<X>::value,
                "ulysses row-transform concept: the type needs `void operator()(const RowCoord& at, double* row, std::int64_t n) "
                "const` (layout/transform.hpp)");
  static_assert(detail::has_row_call<X>::value,
                "ulysses row-transform concept: the type has an operator() whose signature is not `void operator()(const RowCoord& at, "
                "double* row, std::int64_t n) const` (rows are transformed in place, in double; layout/transform.hpp)");
  static_assert(std::is_void_v<decltype(std::declval<const X&>()(std::declval<const RowCoord&>(), std::declval<double*>(),
                                                                 std::declval<std::int64_t>()))>,
                "ulysses row-transform concept: operator()(const RowCoord&, double*, std::int64_t) must return void");
  return true;
}

/// A non-owning reference to one row transform (what RowTransforms holds per tensor and side).
struct RowTransformRef {
  const void* object = nullptr;                                          ///< the transform (the caller's object)
  void (*apply)(const void*, const RowCoord&, double*, std::int64_t) = nullptr;  ///< calls it
  /// The transform's check_rows(B, S, D) (optional: null when it has none), called by every call
  /// before any byte moves with the plan's batch, sequence length and the tensor's head dim.
  void (*check)(const void*, std::int64_t, std::int64_t, std::int64_t) = nullptr;
  /// The transform's fused copy_row(at, type, src, dst, n) (optional: null when it has none):
  /// loads, transforms and stores one row with the same bits as load_row(), the transform and
  /// store_row(); it returns false, touching nothing, for a type it does not fuse.
  bool (*copy)(const void*, const RowCoord&, ElementType, const std::byte*, std::byte*, std::int64_t) = nullptr;
  /// The transform's fused copy_run(run, type) (optional: null when it has none): copy over a
  /// RowRun of rows in one call, with the same bits; false, touching nothing, where copy would be.
  bool (*copy_run)(const void*, const RowRun&, ElementType) = nullptr;
  bool prefetches_next_src = false;  ///< whether copy_run prefetches RowRun::next_src (else the executor does)
  /// The transform's agreement_word() (optional: null when it has none): a digest of what it
  /// computes (Rope: its style, dims, frequencies and positions), compared across ranks by the calls.
  std::uint64_t (*word)(const void*) = nullptr;
  /// Whether a transform is set.
  constexpr explicit operator bool() const noexcept { return apply != nullptr; }
  /// Applies it to the row (n elements) at `at`. @pre a transform is set.
  void operator()(const RowCoord& at, double* row, std::int64_t n) const { apply(object, at, row, n); }
};

/// The row transforms of one call, per tensor (its index in the plan): `on_pack(t, x)` applies x
/// to tensor t's rows as they are read from the call's INPUT (the sender's side: in seq→head the
/// seq-sharded rows, where they are contiguous), `on_unpack(t, x)` to its rows as they are
/// written into the call's OUTPUT (the receiver's side). Each transform sees the row's RowCoord.
/// A path that copies an input row straight into an output (the peer copy, a rank's own chunk)
/// applies the pack transform, rounds to the element type as the wire would, then applies the
/// unpack transform: every path gives the same bits. A sum of replicated heads (head→seq)
/// applies the pack transform to each input term (rounded), adds the terms by the sum rules of
/// element.hpp and applies the unpack transform to the float32 sum before its one rounding.
///
/// Non-owning: the transform objects must outlive the call (for a split-phase exchange, its
/// finish()). Every rank passes transforms on the same tensors and sides: the calls compare
/// agreement() across ranks with the call's plan and direction (a rank with RoPE beside one without,
/// or a Rope of another theta, is Error(plan_mismatch) on every rank, on the communicators that
/// number their calls; over MpiComm's message path through the call probe of a wait, within a
/// tenth of the timeout); what a transform without agreement_word() computes is not compared. The plan's tensor must have been
/// built with TensorSpec::with_row_transforms(), and the executor must run transforms
/// (executor_traits::row_transforms: HostExecutor); else the call throws Error(invalid_shape)
/// before any byte moves.
class RowTransforms {
 public:
  /// Applies `x` to tensor t's rows on pack (see the class comment). Keeps a reference to x.
  /// @pre 0 <= t < kMaxTensors (else the call that uses it throws Error(invalid_shape))
  template <class X>
  RowTransforms& on_pack(int t, const X& x) {
    return set(pack_, t, x);
  }
  /// Applies `x` to tensor t's rows on unpack (see the class comment). Keeps a reference to x.
  template <class X>
  RowTransforms& on_unpack(int t, const X& x) {
    return set(unpack_, t, x);
  }
  /// A temporary would be gone before the call runs: refused at compile time.
  template <class X>
  RowTransforms& on_pack(int t, const X&& x) = delete;
  /// A temporary would be gone before the call runs: refused at compile time.
  template <class X>
  RowTransforms& on_unpack(int t, const X&& x) = delete;
  /// Tensor t's pack transform (empty when none or t is out of range).
  RowTransformRef pack(int t) const { return t >= 0 && t < kMaxTensors ? pack_[t] : RowTransformRef{}; }
  /// Tensor t's unpack transform (empty when none or t is out of range).
  RowTransformRef unpack(int t) const { return t >= 0 && t < kMaxTensors ? unpack_[t] : RowTransformRef{}; }
  /// Whether tensor t has a transform on either side.
  bool any(int t) const { return static_cast<bool>(pack(t)) || static_cast<bool>(unpack(t)); }
  /// Which tensors and sides have a transform: bit 2t tensor t's pack transform, bit 2t + 1 its
  /// unpack transform (what the calls compare across ranks).
  std::uint64_t sides() const {
    std::uint64_t m = 0;
    for (int t = 0; t < kMaxTensors; ++t)
      m |= (pack(t) ? std::uint64_t{1} : 0) << (2 * t) | (unpack(t) ? std::uint64_t{1} : 0) << (2 * t + 1);
    return m;
  }
  /// What the calls compare across ranks (the exchange's word, with the plan's fingerprint):
  /// sides(), then the agreement_word() of each transform that has one (Rope does), in tensor and
  /// side order. 0 when no tensor has a transform.
  std::uint64_t agreement() const {
    std::uint64_t w = sides();
    for (int t = 0; w && t < kMaxTensors; ++t)
      for (const RowTransformRef& x : {pack_[t], unpack_[t]})
        if (x.word) w = detail::fnv1a(w, x.word(x.object));
    return w;
  }
  /// Whether any tensor has a transform.
  bool empty() const {
    for (int t = 0; t < kMaxTensors; ++t)
      if (any(t)) return false;
    return true;
  }
  /// Whether a tensor index outside [0, kMaxTensors) was given (the calls then refuse the set).
  bool has_bad_index() const { return bad_given_; }
  /// The first tensor index given that is outside [0, kMaxTensors) (when has_bad_index()).
  int bad_index() const { return bad_; }

 private:
  template <class X>
  RowTransforms& set(RowTransformRef* side, int t, const X& x) {
    static_assert(check_row_transform<X>());
    if (t < 0 || t >= kMaxTensors) {
      if (!bad_given_) bad_ = t;  // the first one, whatever its value (-1 included)
      bad_given_ = true;
      return *this;
    }
    side[t] = {&x, [](const void* o, const RowCoord& at, double* row, std::int64_t n) { (*static_cast<const X*>(o))(at, row, n); }};
    if constexpr (detail::has_check_rows<X>::value)
      side[t].check = [](const void* o, std::int64_t B, std::int64_t S, std::int64_t D) { static_cast<const X*>(o)->check_rows(B, S, D); };
    if constexpr (detail::has_copy_row<X>::value)
      side[t].copy = [](const void* o, const RowCoord& at, ElementType type, const std::byte* src, std::byte* dst, std::int64_t n) {
        return static_cast<const X*>(o)->copy_row(at, type, src, dst, n);
      };
    if constexpr (detail::has_copy_run<X>::value)
      side[t].copy_run = [](const void* o, const RowRun& run, ElementType type) { return static_cast<const X*>(o)->copy_run(run, type); };
    side[t].prefetches_next_src = detail::prefetches_next_src<X>::value;
    if constexpr (detail::has_agreement_word<X>::value)
      side[t].word = [](const void* o) { return static_cast<const X*>(o)->agreement_word(); };
    return *this;
  }
  RowTransformRef pack_[kMaxTensors] = {};
  RowTransformRef unpack_[kMaxTensors] = {};
  int bad_ = 0;
  bool bad_given_ = false;
};

/// Built-in transform: every element times `factor` (a QK scale, a softmax scale folded into q),
/// in double, rounded once. Its inverse is Scale{1 / factor} (exact only for powers of two).
struct Scale {
  double factor = 1.0;  ///< the multiplier
  /// row[i] *= factor.
  void operator()(const RowCoord&, double* row, std::int64_t n) const {
    for (std::int64_t i = 0; i < n; ++i) row[i] *= factor;
  }
};

ULYSSES_NAMESPACE_END
