// The single-process communicator and the process group (comm.h).
#include "parallel/comm.h"

#include <cstdlib>
#include <cstring>

namespace attnres {
namespace {

class DonePending final : public PendingCollective {
 public:
  void wait() override {}
};

std::shared_ptr<Communicator>& group_slot() {
  static std::shared_ptr<Communicator> g;
  return g;
}

bool started_by_mpi_launcher() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"})
    if (std::getenv(v) != nullptr) return true;
  return false;
}

}  // namespace

void SingleProcess::allgatherv(const void* send, void* recv, std::span<const int64_t> bytes) {
  if (send != recv && !bytes.empty()) std::memmove(recv, send, static_cast<size_t>(bytes[0]));
}

std::unique_ptr<PendingCollective> SingleProcess::start_allgatherv(const void* send, void* recv,
                                                                   std::span<const int64_t> bytes) {
  allgatherv(send, recv, bytes);
  return std::make_unique<DonePending>();
}

void SingleProcess::abort(int code) {
  std::exit(code);
}

std::shared_ptr<Communicator> process_group() {
  std::shared_ptr<Communicator>& g = group_slot();
  if (!g) g = std::make_shared<SingleProcess>();
  return g;
}

std::string start_process_group(int* argc, char*** argv) {
  std::shared_ptr<Communicator>& g = group_slot();
  if (g) return "";
  if (!started_by_mpi_launcher()) {
    g = std::make_shared<SingleProcess>();
    return "";
  }
#ifdef ATTNRES_MPI
  g = mpi_world(argc, argv);
  return "";
#else
  (void)argc;
  (void)argv;
  g = std::make_shared<SingleProcess>();
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (size != nullptr && std::strcmp(size, "1") != 0)
    return std::string("started by an MPI launcher with ") + size +
           " ranks, but this attnres was built without MPI (configure with -DATTNRES_MPI=ON "
           "and libopenmpi-dev installed)";
  return "";
#endif
}

void end_process_group() {
#ifdef ATTNRES_MPI
  mpi_finalize();
#endif
}

bool built_with_mpi() {
#ifdef ATTNRES_MPI
  return true;
#else
  return false;
#endif
}

}  // namespace attnres
