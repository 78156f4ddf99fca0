#include <ulysses/ulysses.hpp>
#include <cstdio>
using namespace ulysses;
const int P = 4;
Plan mk(int r, int S, Format f, Path path = Path::automatic, int K = 1) {
  PlanOptions o; o.stages = K; o.path = path;
  return Plan({P, r}, 2, SeqPartition::even(S, P), {TensorSpec::of<float>(HeadPartition::even(8, P), 3), TensorSpec::of<float>(HeadPartition::even(4, P), 2)}, f, o);
}
struct Out { std::vector<float> a, b; bool operator==(const Out& o) const { return a == o.a && b == o.b; } };
Out call(const Plan& p, LocalGroup::Comm& c, int salt, Direction d) {
  std::vector<float> i0(p.input_bytes(d, 0) / 4), i1(p.input_bytes(d, 1) / 4);
  for (size_t i = 0; i < i0.size(); ++i) i0[i] = float(1000 * c.rank() + i + 7 * salt);
  for (size_t i = 0; i < i1.size(); ++i) i1[i] = float(-1000 * c.rank() - float(i) + salt);
  Out o{std::vector<float>(p.output_bytes(d, 0) / 4, -1), std::vector<float>(p.output_bytes(d, 1) / 4, -1)};
  std::vector<std::byte> ws(p.workspace_bytes());
  HostExecutor ex;
  redistribute(p, d, c, ex, {ConstByteSpan(i0), ConstByteSpan(i1)}, {ByteSpan(o.a), ByteSpan(o.b)}, ws);
  return o;
}
int main() {
  int bad = 0;
  // reference: fresh group per configuration
  Format fs[3] = {Format::bshd, Format::sbhd, Format::bhsd};
  auto fresh = [&](int S, int fi, Path path, int K, int salt, Direction d, int r) {
    std::vector<Out> out(P);
    LocalGroup g(P);
    g.spawn([&](LocalGroup::Comm& c) { out[c.rank()] = call(mk(c.rank(), S, fs[(fi + c.rank()) % 3], path, K), c, salt, d); });
    return out[r];
  };
  Path ps[3] = {Path::direct, Path::messages, Path::alltoallv};
  std::vector<std::vector<Out>> got(P);
  LocalGroup g(P);
  const int N = int(ExchangeState::kMaxPlans) + 20;
  g.spawn([&](LocalGroup::Comm& c0) {
    LocalGroup::Comm c = c0;  // copy
    std::vector<Plan> plans;
    for (int i = 0; i < N; ++i) plans.push_back(mk(c.rank(), 8 + 4 * (i % 3), fs[(i + c.rank()) % 3], ps[i % 3], 1 + i % 3));
    for (int i = 0; i < N; ++i) got[c.rank()].push_back(call(plans[i], (i % 2 ? c : c0), i, Direction(i % 2)));
    for (int i = 0; i < 10; ++i) got[c.rank()].push_back(call(plans[i], c, i, Direction(i % 2)));  // evicted ones again
    LocalGroup::Comm c2 = c;  // a copy made late
    for (int i = N - 5; i < N; ++i) got[c.rank()].push_back(call(plans[i], c2, i, Direction(i % 2)));
  });
  for (int r = 0; r < P; ++r) {
    int k = 0;
    auto chk = [&](int i) {
      Out w = fresh(8 + 4 * (i % 3), i, ps[i % 3], 1 + i % 3, i, Direction(i % 2), r);
      if (!(w == got[r][k])) { ++bad; if (bad < 5) std::printf("rank %d call %d (plan %d) differs\n", r, k, i); }
      ++k;
    };
    for (int i = 0; i < N; ++i) chk(i);
    for (int i = 0; i < 10; ++i) chk(i);
    for (int i = N - 5; i < N; ++i) chk(i);
  }
  std::printf("bad=%d\n", bad);
  return bad != 0;
}
