// SPDX-License-Identifier: Apache-2.0
// copy.hpp: the host executor (single- and multi-threaded, with and without streaming stores),
// copies and sums.
#include <doctest/doctest.h>
#include <ulysses/host/executor.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "cases.hpp"
#include "harness.hpp"

using namespace ulysses;

TEST_CASE("host executor: strided d (transpose-like) copies element by element, exactly") {
  // src [1, 2, 3, 4] with d outermost (strides 24, 1, 2, 6... ) → dense bshd dst.
  const std::int64_t ext[4] = {1, 2, 3, 4}, src[4] = {24, 1, 2, 6}, dst[4] = {24, 12, 4, 1};
  std::vector<float> a(24), b(24, -1.f);
  std::iota(a.begin(), a.end(), 0.f);
  BlockCopy c;
  REQUIRE(detail::make_block(ext, src, dst, sizeof(float), 0, 0, 0, 1, c));
  CHECK(c.row_bytes == 4);
  BufferTable t;
  t.base[0] = reinterpret_cast<std::byte*>(a.data());
  t.base[1] = reinterpret_cast<std::byte*>(b.data());
  HostExecutor{}.run(&c, 1, t);
  for (int s = 0; s < 2; ++s)
    for (int h = 0; h < 3; ++h)
      for (int d = 0; d < 4; ++d) CHECK(b[s * 12 + h * 4 + d] == a[s * 1 + h * 2 + d * 6]);
}

TEST_CASE("host executor rows: copy_rows() of every fixed row size and others, strided, contiguous and streaming, copies exactly the rows") {
  // (the fixed sizes 1..16, 256, 512 each have their own loop; 512 goes in 64-byte pieces; 320, 1024, 3: the generic loop)
  for (std::int64_t row : {1, 2, 3, 4, 8, 16, 64, 256, 320, 512, 1024})
    for (std::int64_t gap : {0, 64, 7})
      for (bool streaming : {false, true}) {
        INFO("row " << row << " gap " << gap << (streaming ? " streaming" : ""));
        const std::int64_t n = 9, ss = row + gap, ds = row + 2 * gap;
        std::vector<std::byte> src(static_cast<std::size_t>(n * ss + 1)), dst(static_cast<std::size_t>(n * ds + 1), std::byte{0xee});
        for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i * 131 + 7);
        std::vector<std::byte> want = dst;  // byte by byte, from offset 1 on both sides (misaligned)
        for (std::int64_t i = 0; i < n; ++i)
          for (std::int64_t b = 0; b < row; ++b) want[static_cast<std::size_t>(1 + i * ds + b)] = src[static_cast<std::size_t>(1 + i * ss + b)];
        detail::copy_rows_as(streaming, dst.data() + 1, src.data() + 1, n, row, ds, ss);
        if (streaming) detail::stream_fence();
        CHECK(dst == want);
      }
}

TEST_CASE("host executor: block at byte offsets with odd element size (3 bytes)") {
  const std::int64_t ext[4] = {1, 2, 1, 2}, src[4] = {0, 4, 2, 1}, dst[4] = {0, 2, 2, 1};
  std::vector<unsigned char> a(30), b(30, 0);
  std::iota(a.begin(), a.end(), 1);
  BlockCopy c;
  REQUIRE(detail::make_block(ext, src, dst, 3, 3, 6, 0, 1, c));
  CHECK(c.row_bytes == 6);
  BufferTable t;
  t.base[0] = reinterpret_cast<std::byte*>(a.data());
  t.base[1] = reinterpret_cast<std::byte*>(b.data());
  HostExecutor{}.run(&c, 1, t);
  // rows: src bytes [3,9) and [15,21) → dst bytes [6,12) and [12,18)
  CHECK(std::vector<unsigned char>(b.begin() + 6, b.begin() + 18) ==
        std::vector<unsigned char>{4, 5, 6, 7, 8, 9, 16, 17, 18, 19, 20, 21});
  CHECK(b[5] == 0);
  CHECK(b[18] == 0);
}

// ---- parallel and streaming host executor ------------------------------------------------------
// Reference: a naive element-by-element loop over the (b, s, h, d) block. Every executor setting
// (1, 2, 3 threads; splitting forced down to 1 byte per thread; streaming stores always or never)
// must give the same bytes, and touch nothing else.

namespace {

struct RandomList {
  std::vector<std::vector<unsigned char>> src, dst;  // one source and one destination buffer per block
  std::vector<BlockCopy> blocks;
  std::vector<std::int64_t> ext_, sst_, dst_, eb_, soff_, doff_;  // per block: 4 + 4 + 4 + 1 + 1 + 1
};

/// A random (b, s, h, d) layout of extents e: dims in a random memory order, each padded.
void random_strides(std::mt19937& g, const std::int64_t e[4], std::int64_t st[4], bool d_inner) {
  int order[4] = {0, 1, 2, 3};
  std::shuffle(order, order + 4, g);
  if (d_inner) std::iter_swap(std::find(order, order + 4, 3), order + 3);  // d fastest
  std::int64_t s = 1;
  for (int k = 3; k >= 0; --k) {
    const int i = order[k];
    st[i] = s;
    s *= e[i] + static_cast<std::int64_t>(g() % 3);  // padding 0..2
  }
}

std::int64_t span(const std::int64_t e[4], const std::int64_t st[4]) {
  std::int64_t n = 1;
  for (int i = 0; i < 4; ++i) n += (e[i] - 1) * st[i];
  return n;
}

/// n random blocks (elem sizes 1..16 bytes, rows from 1 element to kilobytes, odd offsets), block i
/// from input(i) to output(i).
RandomList random_list(std::mt19937& g, int n) {
  RandomList l;
  const std::int64_t elems[] = {1, 2, 3, 4, 8, 16};
  for (int i = 0; i < n; ++i) {
    std::int64_t e[4], ss[4], ds[4];
    const bool big = g() % 3 == 0;
    e[0] = 1 + g() % 3, e[1] = 1 + g() % (big ? 40 : 7), e[2] = 1 + g() % 5, e[3] = 1 + g() % (big ? 200 : 9);
    const std::int64_t eb = elems[g() % 6];
    random_strides(g, e, ss, g() % 4 != 0);
    random_strides(g, e, ds, g() % 4 != 0);
    const std::int64_t so = static_cast<std::int64_t>(g() % 5) * eb, dof = static_cast<std::int64_t>(g() % 5) * eb + 1;
    l.src.emplace_back(static_cast<std::size_t>((span(e, ss) + 5) * eb));
    l.dst.emplace_back(static_cast<std::size_t>((span(e, ds) + 5) * eb + 1), static_cast<unsigned char>(0xa5));
    for (auto& x : l.src.back()) x = static_cast<unsigned char>(g());
    BlockCopy c;
    REQUIRE(detail::make_block(e, ss, ds, eb, so, dof, BufferIndex::input(i), BufferIndex::output(i), c));
    l.blocks.push_back(c);
    l.ext_.insert(l.ext_.end(), e, e + 4);
    l.sst_.insert(l.sst_.end(), ss, ss + 4);
    l.dst_.insert(l.dst_.end(), ds, ds + 4);
    l.eb_.push_back(eb), l.soff_.push_back(so), l.doff_.push_back(dof);
  }
  return l;
}

BufferTable table_of(RandomList& l) {
  BufferTable t;
  for (std::size_t i = 0; i < l.blocks.size(); ++i) {
    t.base[BufferIndex::input(static_cast<int>(i))] = reinterpret_cast<std::byte*>(l.src[i].data());
    t.base[BufferIndex::output(static_cast<int>(i))] = reinterpret_cast<std::byte*>(l.dst[i].data());
  }
  return t;
}

/// The destination buffers the naive element loop produces.
std::vector<std::vector<unsigned char>> naive(const RandomList& l) {
  std::vector<std::vector<unsigned char>> out = l.dst;
  for (std::size_t k = 0; k < l.blocks.size(); ++k) {
    const std::int64_t* e = &l.ext_[4 * k];
    const std::int64_t* ss = &l.sst_[4 * k];
    const std::int64_t* ds = &l.dst_[4 * k];
    const std::int64_t eb = l.eb_[k];
    for (std::int64_t a = 0; a < e[0]; ++a)
      for (std::int64_t b = 0; b < e[1]; ++b)
        for (std::int64_t c = 0; c < e[2]; ++c)
          for (std::int64_t d = 0; d < e[3]; ++d) {
            const std::int64_t so = l.soff_[k] + (a * ss[0] + b * ss[1] + c * ss[2] + d * ss[3]) * eb;
            const std::int64_t dof = l.doff_[k] + (a * ds[0] + b * ds[1] + c * ds[2] + d * ds[3]) * eb;
            std::memcpy(&out[k][static_cast<std::size_t>(dof)], &l.src[k][static_cast<std::size_t>(so)], static_cast<std::size_t>(eb));
          }
  }
  return out;
}

}  // namespace

TEST_CASE("parallel host executor: 1, 2, 3 threads, streaming on and off, give the naive loop's bytes") {
  std::mt19937 g(12345);
  for (int trial = 0; trial < 60; ++trial) {
    RandomList base = random_list(g, 1 + static_cast<int>(g() % 8));
    const auto want = naive(base);
    for (int threads : {1, 2, 3})
      for (std::size_t min_bytes : {std::size_t{1}, std::size_t{97}, std::size_t{1} << 20})
        for (std::size_t streaming : {std::size_t{0}, SIZE_MAX}) {
          CAPTURE(trial);
          CAPTURE(threads);
          CAPTURE(min_bytes);
          CAPTURE(streaming);
          RandomList l = base;
          HostExecutor ex(HostExecutorOptions{threads, min_bytes, streaming});
          CHECK(ex.threads() == threads);
          ex.run(l.blocks.data(), l.blocks.size(), table_of(l));
          CHECK(l.dst == want);
        }
  }
}

TEST_CASE("parallel host executor: large rows split mid-row across threads, misaligned streaming destinations") {
  // Rows of 4096+13 bytes and one contiguous block, destinations at odd offsets: thread cuts fall
  // inside rows; streaming stores need their 16-byte-aligned bodies plus unaligned heads and tails.
  for (std::int64_t off : {0, 1, 7, 15}) {
    const std::int64_t rows = 37, row = 4096 + 13;
    std::vector<unsigned char> a(static_cast<std::size_t>(rows * (row + 50) + 64)), b(a.size() + 64, 0), ref(b.size(), 0);
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<unsigned char>(i * 7 + 3);
    const std::int64_t ext[4] = {1, 1, rows, row}, ss[4] = {0, 0, row + 50, 1}, ds[4] = {0, 0, row + 3, 1};
    const std::int64_t ext2[4] = {1, 1, 1, 3000}, st2[4] = {0, 0, 0, 1};
    BlockCopy c[2];
    REQUIRE(detail::make_block(ext, ss, ds, 1, 5, off, 0, 1, c[0]));
    REQUIRE(detail::make_block(ext2, st2, st2, 1, 0, 0, 0, 2, c[1]));
    std::vector<unsigned char> b2(3000 + 64, 0), ref2 = b2;
    BufferTable t;
    t.base[0] = reinterpret_cast<std::byte*>(a.data());
    t.base[1] = reinterpret_cast<std::byte*>(ref.data());
    t.base[2] = reinterpret_cast<std::byte*>(ref2.data());
    HostExecutor(HostExecutorOptions{1, 1, SIZE_MAX}).run(c, 2, t);  // plain memcpy rows: the reference
    for (int threads : {1, 2, 3, 5}) {
      std::fill(b.begin(), b.end(), 0);
      std::fill(b2.begin(), b2.end(), 0);
      t.base[1] = reinterpret_cast<std::byte*>(b.data());
      t.base[2] = reinterpret_cast<std::byte*>(b2.data());
      HostExecutor(HostExecutorOptions{threads, 1, 0}).run(c, 2, t);
      CHECK(b == ref);
      CHECK(b2 == ref2);
    }
  }
}

TEST_CASE("host executor: settings, copies and concurrent callers") {
  CHECK(HostExecutor{}.threads() == 1);
  CHECK(HostExecutor{}.options().min_bytes_per_thread == HostExecutorOptions{}.min_bytes_per_thread);
  CHECK_THROWS_AS(HostExecutor(0), Error);
  CHECK_THROWS_AS(HostExecutor(HostExecutorOptions{2, 0}), Error);
  try {
    HostExecutor bad(-1);
  } catch (const Error& e) {
    CHECK(e.code() == Errc::invalid_shape);
  }
  HostExecutor a(HostExecutorOptions{3, 1});
  HostExecutor b = a;  // its own workers, same options
  CHECK(b.threads() == 3);
  CHECK(b.options().min_bytes_per_thread == 1);
  HostExecutor c = std::move(b);
  CHECK(c.threads() == 3);
  HostExecutor d;
  d = c;
  CHECK(d.threads() == 3);

  // One multi-threaded executor used from two threads at once: calls are serialised, both correct.
  std::mt19937 g(7);
  RandomList l1 = random_list(g, 6), l2 = random_list(g, 6);
  const auto w1 = naive(l1), w2 = naive(l2);
  for (int rep = 0; rep < 20; ++rep) {
    RandomList x1 = l1, x2 = l2;
    std::thread other([&] { a.run(x2.blocks.data(), x2.blocks.size(), table_of(x2)); });
    a.run(x1.blocks.data(), x1.blocks.size(), table_of(x1));
    other.join();
    CHECK(x1.dst == w1);
    CHECK(x2.dst == w2);
  }
}

TEST_CASE("seq_to_head / head_to_seq with a 2-thread streaming executor per rank (in-process group)") {
  // Total threads = ranks x executor threads; correctness must not depend on it.
  for (int P : {2, 4})
    for (const ut::Case& c : ut::c2_cases(P)) {
      CAPTURE(c.name);
      LocalGroup grp(P);
      std::vector<std::string> err(static_cast<std::size_t>(P));
      const HostExecutor ex(HostExecutorOptions{2, 1, 0});
      grp.spawn([&](LocalGroup::Comm& comm) { err[static_cast<std::size_t>(comm.rank())] = ut::run_case<float>(comm, c, ex); });
      for (auto& e : err) CHECK(e == "");
      grp.spawn([&](LocalGroup::Comm& comm) { err[static_cast<std::size_t>(comm.rank())] = ut::run_case<ut::bf16_t>(comm, c, ex); });
      for (auto& e : err) CHECK(e == "");
    }
}

namespace {
/// A list of sums: each of n destinations [rows, D] of 2-, 4- or 8-byte elements, the sum of 2..5
/// terms read from strided sources, plus copies between them; and the naive reference computed
/// element by element with detail::sum_element.
struct SumList {
  std::vector<std::vector<std::byte>> bufs;  // buffer i at Buffer index i (inputs) / kMaxTensors+i (outputs)
  std::vector<BlockCopy> blocks;
  std::vector<std::vector<std::byte>> want;  // the outputs the reference gives
};
SumList random_sums(std::mt19937& g) {
  SumList l;
  const ElementType types[] = {ElementType::bfloat16, ElementType::float16, ElementType::float32, ElementType::float64};
  const ElementType type = types[g() % 4];
  const std::int64_t e = static_cast<std::int64_t>(size_of(type));
  const std::int64_t rows = 1 + g() % 300, D = 1 + g() % 70, n = 2 + g() % 4;
  // Sources: input(j) holds term j as [rows, D] with row stride D + pad_j (elements).
  std::vector<std::int64_t> pad;
  for (int j = 0; j < n; ++j) {
    pad.push_back(g() % 3);
    l.bufs.emplace_back(static_cast<std::size_t>(rows * (D + pad.back()) * e));
    for (auto& b : l.bufs.back()) b = static_cast<std::byte>(g() % 7 == 0 ? 0x7f : g());  // some NaN/inf patterns
  }
  const std::int64_t dpad = g() % 2;
  const std::size_t out_bytes = static_cast<std::size_t>(rows * (D + dpad) * e);
  const std::int64_t ext[4] = {1, rows, 1, D}, dst[4] = {0, D + dpad, 0, 1};
  std::vector<std::array<std::int64_t, 4>> st;
  for (int j = 0; j < n; ++j) st.push_back({0, D + pad[j], 0, 1});
  std::vector<const std::int64_t*> sp;
  std::vector<std::int64_t> soff(static_cast<std::size_t>(n), 0);
  std::vector<int> sbuf;
  for (int j = 0; j < n; ++j) sp.push_back(st[j].data()), sbuf.push_back(BufferIndex::input(j));
  // A copy first (input 0 → output 1), then the sum into output 0: cuts fall anywhere.
  BlockCopy c;
  REQUIRE(detail::make_block(ext, st[0].data(), dst, e, 0, 0, BufferIndex::input(0), BufferIndex::output(1), c));
  l.blocks.push_back(c);
  std::vector<BlockCopy> grp(static_cast<std::size_t>(n));
  REQUIRE(detail::make_blocks(ext, static_cast<int>(n), sp.data(), dst, e, soff.data(), 0, sbuf.data(), BufferIndex::output(0), type, grp.data()));
  l.blocks.insert(l.blocks.end(), grp.begin(), grp.end());
  for (int o = 0; o < 2; ++o) l.bufs.emplace_back(out_bytes, std::byte{0x5a});
  l.want = {l.bufs[static_cast<std::size_t>(n)], l.bufs[static_cast<std::size_t>(n) + 1]};
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t d = 0; d < D; ++d) {
      std::vector<const std::byte*> terms;
      for (int j = 0; j < n; ++j) terms.push_back(l.bufs[static_cast<std::size_t>(j)].data() + (r * (D + pad[j]) + d) * e);
      const auto at = static_cast<std::size_t>((r * (D + dpad) + d) * e);
      detail::sum_element(type, terms.data(), static_cast<int>(n), l.want[0].data() + at);
      std::memcpy(l.want[1].data() + at, terms[0], static_cast<std::size_t>(e));
    }
  return l;
}
BufferTable sum_table(SumList& l) {
  BufferTable t;
  const std::size_t n = l.bufs.size() - 2;
  for (std::size_t j = 0; j < n; ++j) t.base[BufferIndex::input(static_cast<int>(j))] = l.bufs[j].data();
  t.base[BufferIndex::output(0)] = l.bufs[n].data();
  t.base[BufferIndex::output(1)] = l.bufs[n + 1].data();
  return t;
}
}  // namespace

TEST_CASE("host executor sums: every element the ordered sum of its terms, same bits with 1..4 threads cutting anywhere") {
  std::mt19937 g(2024);
  for (int trial = 0; trial < 80; ++trial) {
    const SumList base = random_sums(g);
    for (int threads : {1, 2, 3, 4})
      for (std::size_t min_bytes : {std::size_t{1}, std::size_t{61}, std::size_t{1} << 20})
        for (std::size_t streaming : {std::size_t{0}, SIZE_MAX}) {  // non-temporal stores always, never
        CAPTURE(trial);
        CAPTURE(threads);
        CAPTURE(min_bytes);
        CAPTURE(streaming);
        SumList l = base;
        HostExecutor(HostExecutorOptions{threads, min_bytes, streaming}).run(l.blocks.data(), l.blocks.size(), sum_table(l));
        const std::size_t n = l.bufs.size() - 2;
        CHECK(l.bufs[n] == l.want[0]);
        CHECK(l.bufs[n + 1] == l.want[1]);
      }
  }
}

TEST_CASE("host executor sums of 4-D blocks: every row of every term visited (row cursor carries), same bits as the reference") {
  // ext [2, 3, 5, 7] elements; each term and the destination padded in every dimension so that
  // make_blocks merges nothing: rows of 7 elements, three outer loops that carry into each other.
  const std::int64_t ext[4] = {2, 3, 5, 7};
  for (ElementType type : {ElementType::float32, ElementType::bfloat16, ElementType::float16, ElementType::float64}) {
    const std::int64_t e = static_cast<std::int64_t>(size_of(type));
    constexpr int n = 3;
    std::mt19937 g(7 + static_cast<unsigned>(type));
    std::array<std::array<std::int64_t, 4>, n> st;
    std::vector<std::vector<std::byte>> bufs;
    for (int j = 0; j < n; ++j) {
      const std::int64_t d2 = 8 + j, d1 = 6 * d2 + j, d0 = 4 * d1;  // padded strides (elements)
      st[static_cast<std::size_t>(j)] = {d0, d1, d2, 1};
      bufs.emplace_back(static_cast<std::size_t>(2 * d0 * e));
      for (auto& b : bufs.back()) b = static_cast<std::byte>(g() % 9 == 0 ? 0x7f : g());
    }
    const std::int64_t dst[4] = {200, 60, 11, 1};
    std::vector<const std::int64_t*> sp;
    std::vector<int> sbuf;
    const std::vector<std::int64_t> soff(n, 0);
    for (int j = 0; j < n; ++j) sp.push_back(st[static_cast<std::size_t>(j)].data()), sbuf.push_back(BufferIndex::input(j));
    std::vector<BlockCopy> grp(n);
    REQUIRE(detail::make_blocks(ext, n, sp.data(), dst, e, soff.data(), 0, sbuf.data(), BufferIndex::output(0), type, grp.data()));
    REQUIRE(grp[0].extent[1] * grp[0].extent[2] * grp[0].extent[3] > 1);
    REQUIRE(grp[0].row_bytes == ext[3] * e);
    const std::size_t out_bytes = static_cast<std::size_t>(2 * dst[0] * e);
    std::vector<std::byte> want(out_bytes, std::byte{0x5a});
    for (std::int64_t i0 = 0; i0 < ext[0]; ++i0)
      for (std::int64_t i1 = 0; i1 < ext[1]; ++i1)
        for (std::int64_t i2 = 0; i2 < ext[2]; ++i2)
          for (std::int64_t i3 = 0; i3 < ext[3]; ++i3) {
            const std::byte* terms[n];
            for (int j = 0; j < n; ++j) {
              const auto& s = st[static_cast<std::size_t>(j)];
              terms[j] = bufs[static_cast<std::size_t>(j)].data() + (i0 * s[0] + i1 * s[1] + i2 * s[2] + i3) * e;
            }
            detail::sum_element(type, terms, n, want.data() + (i0 * dst[0] + i1 * dst[1] + i2 * dst[2] + i3) * e);
          }
    for (int threads : {1, 2, 3})
      for (std::size_t streaming : {std::size_t{0}, SIZE_MAX}) {
        CAPTURE(to_string(type));
        CAPTURE(threads);
        std::vector<std::byte> out(out_bytes, std::byte{0x5a});
        BufferTable t;
        for (int j = 0; j < n; ++j) t.base[BufferIndex::input(j)] = bufs[static_cast<std::size_t>(j)].data();
        t.base[BufferIndex::output(0)] = out.data();
        HostExecutor(HostExecutorOptions{threads, 1, streaming}).run(grp.data(), grp.size(), t);
        CHECK(out == want);
      }
  }
}
