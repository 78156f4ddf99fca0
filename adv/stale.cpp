// Rank 1 alternates between two plans of the same wire (bshd, sbhd: its own business); rank 0
// makes a second plan A2 once, then goes back to A. Compare against a fresh run.
#include <ulysses/ulysses.hpp>
#include <cstdio>
#include <cstring>
using namespace ulysses;
const int P = 2, B = 2, S = 8, H = 4, D = 3;
Plan mk(int r, Format f) { return Plan({P, r}, B, SeqPartition::even(S, P), {TensorSpec::of<float>(HeadPartition::even(H, P), D)}, f); }
std::vector<float> input(const Plan& p, int r, int salt) {
  std::vector<float> v(p.seq_bytes(0) / 4);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(1000 * r + i + 100000 * salt);
  return v;
}
std::vector<float> call(const Plan& p, LocalGroup::Comm& c, int salt) {
  auto in = input(p, c.rank(), salt);
  std::vector<float> out(p.head_bytes(0) / 4, -1);
  std::vector<std::byte> ws(p.workspace_bytes());
  HostExecutor ex;
  seq_to_head(p, c, ex, in, out, ws);
  return out;
}
int main() {
  std::vector<float> got, want;
  {
    LocalGroup g(P);
    g.spawn([&](LocalGroup::Comm& c) {
      if (c.rank() == 0) {
        Plan A = mk(0, Format::bshd), A2 = mk(0, Format::bshd);
        call(A, c, 1);
        call(A2, c, 2);
        got = call(A, c, 3);
      } else {
        Plan B1 = mk(1, Format::bshd), B2 = mk(1, Format::sbhd);
        call(B1, c, 1);
        call(B2, c, 2);
        call(B2, c, 3);
      }
    });
  }
  {
    LocalGroup g(P);
    g.spawn([&](LocalGroup::Comm& c) {
      if (c.rank() == 0) want = call(mk(0, Format::bshd), c, 3);
      else call(mk(1, Format::sbhd), c, 3);
    });
  }
  std::printf("rank 0 output %s the fresh run's\n", got == want ? "EQUALS" : "DIFFERS FROM");
  int n = 0; for (size_t i = 0; i < got.size(); ++i) if (got[i] != want[i] && n++ < 6) std::printf("[%zu] %g want %g  ", i, got[i], want[i]);
  std::printf("\n");
  return got == want ? 0 : 1;
}
