# shellcheck shell=bash disable=SC2034,SC2154 # globals shared by these files; tests check them together too
# The node program's entry (launch/jobs/node_programs.py sends every file of launch/node/host/,
# this one last): main LABEL_JOB LABEL_MIN_DRIVER LABEL_OPENMPI_MAJOR SUPERVISOR_EVENT STEP ARGS...
# The labels and the supervisor's event prefix come from dtrain/contract.py; STEP is one of the
# functions above, with its own arguments.
main() {
  LABEL_JOB=$1 LABEL_MIN_DRIVER=$2 LABEL_OPENMPI_MAJOR=$3 SUPERVISOR_EVENT=$4
  local step=$5
  shift 5
  case $step in
    up|pull|probe|remove|doctor|prepare|prepare_up|supervise|job_file|keep_workdir|booted) "$step" "$@" ;;
    *) echo "dtrain node program: unknown step $step" >&2; exit 2 ;;
  esac
}

main "$@"
