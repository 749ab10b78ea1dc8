#include "server/spin_policy.h"

#include <sched.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"

namespace fp4q::server {

int CpusOfCpuMax(const std::string& cpu_max) {
  std::istringstream in(cpu_max);
  std::string quota, period;
  if (!(in >> quota >> period) || quota == "max") return 0;
  int64_t q = 0, p = 0;
  if (!absl::SimpleAtoi(quota, &q) || !absl::SimpleAtoi(period, &p) || q <= 0 || p <= 0) {
    return 0;
  }
  return static_cast<int>(std::min<int64_t>((q + p - 1) / p, 1 << 20));
}

int UsableCpus() {
  int cpus = static_cast<int>(std::thread::hardware_concurrency());
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) cpus = CPU_COUNT(&set);
  // cgroup v2, as a container sees its own cgroup at the root of /sys/fs/cgroup.
  std::ifstream f("/sys/fs/cgroup/cpu.max");
  std::string line;
  if (f && std::getline(f, line)) {
    const int quota = CpusOfCpuMax(line);
    if (quota > 0) cpus = std::min(cpus, quota);
  }
  return std::max(cpus, 1);
}

}  // namespace fp4q::server
