"""Running jobs: hosts, parallel ssh, command builders, the job's lifecycle."""
