// Thread counts (include/attnres/engine.h).
#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <string>

#include "attnres/engine.h"

namespace attnres {

int default_thread_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return std::max(1, omp_get_num_procs());
  // One thread per physical core: CPUs that share a core (SMT siblings) count once.
  std::set<std::string> cores;
  int cpus = 0;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &set)) continue;
    ++cpus;
    std::ifstream f("/sys/devices/system/cpu/cpu" + std::to_string(c) +
                    "/topology/thread_siblings_list");
    std::string siblings;
    if (f >> siblings) {
      cores.insert(siblings);
    } else {
      cores.insert("cpu" + std::to_string(c));
    }
  }
  return std::max<int>(1, cores.empty() ? cpus : static_cast<int>(cores.size()));
}

void set_thread_count(int threads) {
  omp_set_num_threads(std::max(1, threads));
}

int thread_count() {
  return omp_get_max_threads();
}

}  // namespace attnres
