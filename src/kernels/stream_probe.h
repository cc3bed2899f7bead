// STREAM-style memory-bandwidth probe: the hardware limit that decode GEMV, the AttnRes read and
// `attnres bench` are measured against.
//
// Contract: stream_probe() allocates three f64 arrays of `array_bytes` each (default: 4x the
// last-level cache, at least 64 MiB) on transparent huge pages (WeightMemory, where the weights
// and the per-sequence state live), first-touches them from the threads that will use them
// (a contiguous static partition over the pool's threads, util/parallel.h), then times `reps`
// passes of each kernel and reports the best pass as GB/s (1 GB = 1e9 bytes):
//   copy:  c[i] = a[i]                 counts 2 arrays of traffic (STREAM convention, no
//   triad: a[i] = b[i] + s * c[i]      counts 3 arrays              write-allocate traffic)
//   read:  sum += b[i] (64-bit words)  counts 1 array (the access pattern of a GEMV: a pure
//                                      streaming read; the limit decode GEMV is held to)
// The arrays' final contents are checked against the closed-form values (as STREAM does), and
// a mismatch is an error. Not thread-safe with itself (it saturates the machine by design).
//
// The read pass loads the widest vectors the CPU has (Highway dispatch), as the kernels do. On
// 4 KiB pages with 16-byte loads it understated what the machine gives the engine: on the Zen 4
// development host, in a minute where the dense decode projections streamed 54-60 GB/s, a
// two-thread read of 128 MiB read 49.6 GB/s that way, 54.8 on huge pages and 62.4 on huge pages
// with 64-byte loads (best of six passes each, alternated, 2026-12-07; docs/performance.md,
// "The probe's pages and loads").
#pragma once

#include <cstddef>
#include <cstdint>

#include "util/status.h"

namespace attnres {

struct StreamOptions {
  size_t array_bytes = 0;  // bytes per array; 0: 4 x last-level cache, at least 64 MiB
  int reps = 5;            // timed passes per kernel (best is reported); >= 1
  int threads = 0;         // threads; 0: parallel_threads()
};

struct StreamResult {
  double copy_gb_s = 0.0;
  double triad_gb_s = 0.0;
  double read_gb_s = 0.0;
  size_t array_bytes = 0;  // bytes per array actually used
  int threads = 0;
  int reps = 0;
};

// One read pass (the probe's read kernel) over bytes [data, data + bytes): the sum of its 64-bit
// words mod 2^64 (returned so the loads cannot be elided), `threads` threads (0: all of the
// pool's), contiguous static partition. Benchmarks pair it with a kernel reading the same number of
// bytes, call for call, so both see the same machine state.
uint64_t stream_read_pass(const std::byte* data, size_t bytes, int threads);

// Last-level cache size in bytes (util/cpu.h, from sysfs), or 32 MiB if the OS does not say.
size_t last_level_cache_bytes();

// Mean read bandwidth over `seconds` (at least one pass) of back-to-back read passes over one
// array of the probe's default size, first-touched by the reading threads: total bytes over
// total time, the rate a sustained stream sees, where the probe reports its best pass. `threads`
// as in StreamOptions. Errors: kInvalidArgument (seconds not > 0), kInternal (no memory).
Result<double> sustained_read_gb_s(double seconds, int threads = 0);

// Runs the probe. Errors: kInvalidArgument (reps < 1, array_bytes below 1 KiB), kInternal
// (a result array does not hold the expected values).
Result<StreamResult> stream_probe(const StreamOptions& options = {});

}  // namespace attnres
