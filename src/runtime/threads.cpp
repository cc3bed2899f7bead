// Thread counts (include/attnres/engine.h): the pool of util/parallel.h.
#include "attnres/engine.h"
#include "util/parallel.h"

namespace attnres {

int default_thread_count() {
  return physical_cores();
}

void set_thread_count(int threads) {
  set_parallel_threads(threads);
}

int thread_count() {
  return parallel_threads();
}

}  // namespace attnres
