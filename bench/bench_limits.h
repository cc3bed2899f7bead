// Hardware limits shared by the micro-benchmarks: this machine's STREAM bandwidth, measured once
// per process (full-size arrays, all of the pool's threads) the first time a benchmark asks for it.
#pragma once

#include "kernels/stream_probe.h"

namespace attnres::bench {

// Aborts the process with the probe's error if the probe fails (a benchmark without its limit
// would report a meaningless fraction).
const StreamResult& stream_limit();

}  // namespace attnres::bench
