# Shared by the MPI tests: the launcher with the flags a small shared machine needs.
#   MPIRUN NP ARGS...  runs ARGS on NP ranks (oversubscribed, unbound, shared-memory transport)
set -euo pipefail
mpi_flags=(--oversubscribe --bind-to none --mca btl self,vader)
[ "$(id -u)" -eq 0 ] && mpi_flags+=(--allow-run-as-root)
MPIRUN() {
  local np=$1
  shift
  "$MPIEXEC" "${mpi_flags[@]}" -np "$np" "$@"
}
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
