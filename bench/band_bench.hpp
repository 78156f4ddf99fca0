// SPDX-License-Identifier: Apache-2.0
// ulysses_perf --op bands: the band pipeline (bands.hpp) against the serial layer, per sequence
// length S, attention ratio f (--attn-ratio) and band count G (--bands). A layer is seq->head of
// q, k, v + the attention + head->seq of o. The attention is a stand-in that takes f times the
// serial exchange (seq->head + head->seq, measured first in the same run), split over the bands
// by their share of the rank's query heads: `sleep` (a device kernel: the host is free while it
// runs), `spin` (host compute: it needs the cores the copies need), or under SMPI a simulated
// sleep (smpi_nanosleep). Each row: the layer's time (the slowest rank's, median), its ratio to
// the serial layer of the same run (G = 1 with blocking calls), and the exposed communication
// (time - attention) / serial exchange. Included by ulysses_perf.cpp after its Options and clocks.
#pragma once

#include <ulysses/bands.hpp>
#include <ulysses/tune/band_cost.hpp>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <functional>
#include <memory>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

namespace band_bench {

using namespace ulysses;

/// The stand-in attention: `seconds` of `kind` ("sleep", "spin"); a simulated sleep under SMPI.
inline void stand_in(double seconds, const std::string& kind) {
  if (seconds <= 0) return;
#ifdef SMPI_H
  (void)kind;  // simulated time: a sleep of the simulated host (smpi_execute() scales by the real host's speed)
  const timespec ts{static_cast<time_t>(seconds), static_cast<long>((seconds - static_cast<double>(static_cast<time_t>(seconds))) * 1e9)};
  smpi_nanosleep(&ts, nullptr);
#else
  if (kind == "sleep") {
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    return;
  }
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
  }
#endif
}

/// One rank's buffers of one layer at one S: seq-sharded q, k, v and o, head-sharded q, k, v and o,
/// the two workspaces; HeadBands for each G asked (bands[i]), all over the same buffers.
struct Layer {
  std::vector<std::unique_ptr<HeadBands>> bands;
  std::vector<std::vector<std::byte>> seq, head;  // q, k, v, o
  std::vector<std::byte> ws_qkv, ws_o;
  std::int64_t Hr = 1;
  Layer(int P, int r, std::int64_t B, std::int64_t S, const AttentionSpecs& specs, const std::vector<int>& G) {
    const SeqPartition sp = SeqPartition::balanced(S, P);
    std::size_t ws1 = 0, ws2 = 0;
    for (int g : G) {
      bands.push_back(std::make_unique<HeadBands>(Group{P, r}, B, sp, specs, g));
      ws1 = std::max(ws1, bands.back()->qkv().workspace_bytes());
      ws2 = std::max(ws2, bands.back()->out().workspace_bytes());
    }
    const HeadBands& b = *bands[0];
    for (int t = 0; t < 3; ++t) seq.emplace_back(b.qkv().seq_bytes(t), std::byte{1}), head.emplace_back(b.qkv().head_bytes(t), std::byte{2});
    seq.emplace_back(b.out().seq_bytes(0), std::byte{3});
    head.emplace_back(b.out().head_bytes(0), std::byte{4});
    ws_qkv.assign(ws1, std::byte{5});
    ws_o.assign(ws2, std::byte{6});
    Hr = std::max<std::int64_t>(1, specs.query_heads.count(r));
  }
  TensorList<ConstByteSpan> qkv_seq() const { return {seq[0], seq[1], seq[2]}; }
  TensorList<ByteSpan> qkv_head() { return {head[0], head[1], head[2]}; }
};

/// One row of the table.
struct BandRow {
  std::int64_t S = 0;
  double f = 0;
  int G = 0;
  double exchange_us = 0, attention_us = 0, us = 0, serial_us = 0;
  double bands_exchange_us = 0;  // the G bands' exchanges alone (the pipeline without attention)
  double model_us = 0;   // the cost model's pipelined time (band_cost()) from the measured exchanges; 0: G > the units
  bool advised = false;  // the G best_bands() picks among those timed
  std::string progress;
};

/// The exchanges of `w` from one run's measurements: `in_s` and `out_s` the serial seq->head and
/// head->seq (seconds), `bands_s` the G bands' exchanges alone. The bands move the same bytes in
/// G times the calls and messages, so their excess over the serial exchange is the part each band
/// pays again: fixed = (bands_s - in_s - out_s) / (G - 1), shared by the two directions in
/// proportion to their times (then G bands sum to bands_s, band_cost()). A G bands' time below the
/// serial one is the run's noise (no byte or message fewer): no fixed part, the serial times.
inline void band_measured_exchanges(BandWork& w, double in_s, double out_s, double bands_s, int G) {
  const double serial = in_s + out_s;
  const double fixed = G > 1 && serial > 0 ? std::max(0.0, bands_s - serial) / (G - 1) : 0;
  w.seq_to_head = {in_s, serial > 0 ? std::min(in_s, fixed * in_s / serial) : 0};
  w.head_to_seq = {out_s, serial > 0 ? std::min(out_s, fixed * out_s / serial) : 0};
}

/// The sweep on one rank of `comm` (every rank calls it alike): rows on every rank. Exec: the
/// executor of the copies (HostExecutor; ulysses_perf's SkipCopies with --copies 0: the messages
/// alone, for simulated time). `now()` is the backend's clock in seconds; `alternate(calls)` the
/// tool's alternate_all().
/// The advice of each (S, f) comes from the cost model fed with this run's measurements: the
/// serial exchange (G = 1's exchanges alone, timed as every G's, where 1 is among the G; split as
/// the seq->head and head->seq timed alone) as the exchanges' times, and as the part each band pays again
/// (BandExchange::fixed_s) the G bands' exchanges alone (the pipeline without attention) over the
/// serial exchange, divided by G - 1 (band_measured_exchanges()); `call_s` a call; nothing overlaps
/// when the stand-in spins on the cores the copies need, or when the exchanges are posted (split)
/// and `posts_progress` is false: the caller knows its MPI moves posted bytes only inside its
/// calls. band_cost() of each G timed, the least (ties: the smaller G).
template <class Exec, class Comm, class Now, class Alternate>
std::vector<BandRow> sweep(Comm& comm, const AttentionShape& shape, std::int64_t B, const std::vector<std::int64_t>& sizes,
                           const std::vector<int>& G, const std::vector<double>& ratios, const std::string& kind, Progress progress, bool posts_progress,
                           double call_s, Now&& now, Alternate&& alternate) {
  const int P = comm.size(), r = comm.rank();
  const AttentionSpecs specs = attention_specs<std::uint16_t>(P, shape, ElementType::bfloat16, HeadPolicy::automatic);
  Exec exec;
  std::vector<BandRow> rows;
  auto slowest = [&](auto&& fn) {
    ulysses_group::barrier(comm);
    const double t0 = now();
    fn();
    return ulysses_group::max_over_ranks(comm, (now() - t0) * 1e6);
  };
  std::vector<int> all{1};  // bands[0]: the unbanded layer (the serial calls), then each G asked
  all.insert(all.end(), G.begin(), G.end());
  for (std::int64_t S : sizes) {
    Layer L(P, r, B, S, specs, all);
    const HeadBands& one = *L.bands[0];
    Exchange<Comm, Exec> h(comm, exec, progress);
    const std::vector<double> x = alternate(std::vector<std::function<double()>>{  // the serial exchange, blocking
        [&] { return slowest([&] { seq_to_head(one.qkv(), comm, exec, L.qkv_seq(), L.qkv_head(), L.ws_qkv); }); },
        [&] { return slowest([&] { head_to_seq(one.out(), comm, exec, ConstByteSpan(L.head[3]), ByteSpan(L.seq[3]), L.ws_o); }); }});
    const double x_us = x[0] + x[1];
    // The exchanges of G bands alone (the pipeline with no attention): what G bands cost on the
    // link, which the model takes as each G's exchange time (a band may take another transport
    // than the serial exchange: over MpiWindowComm messages instead of the peer copy).
    std::vector<std::function<double()>> bare;
    for (std::size_t i = 0; i < G.size(); ++i)
      bare.push_back([&, i] {
        return slowest([&] {
          banded_attention(*L.bands[i + 1], comm, exec, L.qkv_seq(), L.qkv_head(), L.ws_qkv, ConstByteSpan(L.head[3]), ByteSpan(L.seq[3]),
                           L.ws_o, [](const Band&) {}, progress);
        });
      });
    const std::vector<double> x_bands = alternate(bare);
    // The model's serial exchange: one band's exchanges timed as every G's are (the pipeline with
    // no attention, one call each way back to back), where G = 1 is among those timed; else the
    // two calls timed alone, each between barriers (up to 1.6x slower in-process on 2 cores).
    const auto one_band = std::find(G.begin(), G.end(), 1);
    const double base = one_band != G.end() ? x_bands[static_cast<std::size_t>(one_band - G.begin())] : x_us;
    std::int64_t units = shape.num_heads;  // the fewest local query heads of a rank: the bands' units
    for (int q = 0; q < P; ++q) units = std::min(units, specs.query_heads.count(q));
    for (double f : ratios) {
      const double attn_s = f * x_us * 1e-6;
      std::vector<std::function<double()>> calls;
      calls.push_back([&] {  // serial: seq->head, the whole attention, head->seq
        return slowest([&] {
          seq_to_head(one.qkv(), comm, exec, L.qkv_seq(), L.qkv_head(), L.ws_qkv);
          stand_in(attn_s, kind);
          head_to_seq(one.out(), comm, exec, ConstByteSpan(L.head[3]), ByteSpan(L.seq[3]), L.ws_o);
        });
      });
      for (std::size_t i = 0; i < G.size(); ++i)
        calls.push_back([&, i] {
          const HeadBands& hb = *L.bands[i + 1];
          return slowest([&] {
            banded_attention(hb, comm, exec, L.qkv_seq(), L.qkv_head(), L.ws_qkv, ConstByteSpan(L.head[3]), ByteSpan(L.seq[3]), L.ws_o,
                             [&](const Band& b) { stand_in(attn_s * static_cast<double>(b.query.size()) / static_cast<double>(L.Hr), kind); },
                             progress);
          });
        });
      const std::vector<double> t = alternate(calls);
      BandWork work;
      work.attention_s = attn_s;
      work.units = static_cast<int>(std::max<std::int64_t>(1, units));
      work.overhead = {call_s, call_s};
      const std::size_t first = rows.size();
      double best = 0;
      for (std::size_t i = 0; i < G.size(); ++i) {
        BandRow w;
        w.S = S, w.f = f, w.G = G[i], w.exchange_us = x_us, w.attention_us = attn_s * 1e6, w.us = t[i + 1], w.serial_us = t[0];
        band_measured_exchanges(work, x[0] * base / x_us * 1e-6, x[1] * base / x_us * 1e-6, x_bands[i] * 1e-6, G[i]);
        w.bands_exchange_us = x_bands[i];
        {
          const ExchangeCall c{&L.bands[i + 1]->qkv(), Direction::seq_to_head, L.qkv_seq(), L.qkv_head(), L.ws_qkv, StageRange::one(0)};
          h.start(&c, 1);
          w.progress = h.progress_name();
          h.finish();
        }
        // nothing overlaps: copies on the cores the attention spins on, or posted messages that move only inside MPI
        work.shares_compute = kind == "spin" || (!posts_progress && w.progress == "split");
        if (G[i] <= work.units) w.model_us = band_cost(work, G[i]).pipelined_s * 1e6;
        if (w.model_us > 0 && (best == 0 || w.model_us < best * (1 - 1e-9))) best = w.model_us;
        rows.push_back(w);
      }
      for (std::size_t i = first; i < rows.size(); ++i)
        if (rows[i].model_us == best) {
          rows[i].advised = true;
          break;
        }
    }
  }
  return rows;
}

/// Prints the rows (rank 0) as a markdown table, then per (S, f) the advised G's time against the
/// best G timed (G = 1 is the serial layer: an engine told 1 band calls the blocking exchanges).
inline void print(const std::vector<BandRow>& rows, const std::string& what) {
  std::printf("# ulysses_perf --op bands: %s\n", what.c_str());
  std::printf("# time: the slowest rank's, median; serial: seq->head + attention + head->seq blocking, same run;\n"
              "# exposed: (time - attention) / serial exchange (1: nothing hidden, 0: all hidden); G exch: the G bands'\n"
              "# exchanges alone; model: band_cost() of G = 1's G exch (else the exchange), each band paying again the G bands'\n"
              "# excess over it / (G - 1) (none where G exch is below it: noise); *: the G the model advises\n");
  std::printf("| S | f | G | progress | exchange (us) | G exch (us) | attention (us) | serial (us) | banded (us) | banded / serial | exposed | model (us) |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const BandRow& w : rows)
    std::printf("| %lld | %g | %d%s | %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.3f | %.3f | %.1f |\n", static_cast<long long>(w.S), w.f, w.G,
                w.advised ? "*" : "", w.progress.c_str(), w.exchange_us, w.bands_exchange_us, w.attention_us, w.serial_us, w.us,
                w.us / w.serial_us, (w.us - w.attention_us) / w.exchange_us, w.model_us);
  std::printf("\n(advised / serial: the advised G's time over the serial layer's; advised G = 1 means the serial layer itself)\n"
              "| S | f | advised G | its time / best timed | best timed G | advised / serial |\n|---|---|---|---|---|---|\n");
  for (std::size_t a = 0; a < rows.size();) {
    std::size_t b = a;
    while (b < rows.size() && rows[b].S == rows[a].S && rows[b].f == rows[a].f) ++b;
    auto time = [](const BandRow& w) { return w.G == 1 ? w.serial_us : w.us; };  // G = 1: the serial layer
    const BandRow* adv = nullptr;
    const BandRow* best = &rows[a];
    for (std::size_t i = a; i < b; ++i) {
      if (rows[i].advised) adv = &rows[i];
      if (time(rows[i]) < time(*best)) best = &rows[i];
    }
    if (adv)
      std::printf("| %lld | %g | %d | %.3f | %d | %.3f |\n", static_cast<long long>(rows[a].S), rows[a].f, adv->G, time(*adv) / time(*best),
                  best->G, time(*adv) / adv->serial_us);
    a = b;
  }
}

}  // namespace band_bench
