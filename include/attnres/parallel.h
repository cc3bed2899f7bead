// attnres public API: running one model on several processes (tensor parallelism over MPI,
// docs/parallel.md).
//
// Under an MPI launcher (`mpirun -np P attnres ...`) every rank starts the same program with
// the same arguments. Rank 0, the leader, does all user-facing I/O (reads prompts, prints,
// serves HTTP) and drives Model and Engine through the ordinary API exactly as one process
// would. Ranks 1..P-1, the followers, call follow_leader() instead of running the command: it
// loads this rank's share of the model when the leader loads the model, and mirrors every
// engine the leader creates and every step it takes, so every rank runs the same engine on the
// same request stream and computes the same admission, scheduling and sampling decisions. The
// leader's Engine::step() first broadcasts the requests submitted and cancelled since its last
// step (a front end needs nothing else: `serve` works like `run`).
//
// Failure policy: a model load or engine creation that fails on any rank fails on every rank
// with a message naming the rank and the reason; a follower that fails anywhere else prints its
// rank and reason and aborts the whole job (MPI_Abort); mpirun ends every rank when one crashes
// or is killed. The leader ends the group with end_processes(status), which the followers'
// follow_leader() returns.
#pragma once

#include <memory>
#include <string>

#include "attnres/engine.h"

namespace attnres {

class Communicator;  // internal (src/parallel/comm.h)

// Call first in main(): starts MPI when the process was started by an MPI launcher and the
// build has MPI (FUNNELED threading). An error when it was started by a launcher with P > 1 but
// the build has no MPI.
Status start_processes(int* argc, char*** argv);
int process_rank();   // 0 without a launcher
int process_count();  // 1 without a launcher
bool built_with_mpi();
// The leader: tells the followers to return `status` from follow_leader(), then ends the group.
// Followers: ends the group. Call once, last, on every rank.
void end_processes(int status);

struct FollowerOptions {
  ModelLoadOptions load;  // this rank's model directory and tokenizer
  int threads = 0;        // applied when the leader loads the model (0: the default)
  // An error this rank already has (its own arguments are bad): reported, with the rank, when
  // the leader loads the model (every rank then fails), or at the leader's exit.
  Status prior;
};
// A follower's whole life: serves the leader until it ends; returns the leader's exit status.
int follow_leader(const FollowerOptions& options);

// "rank R of P: " when P > 1, else "" (for messages).
std::string rank_prefix();

}  // namespace attnres
