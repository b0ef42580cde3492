"""Where nodes come from: the local simulated cluster and host set-up (EC2 stacks and volumes join it)."""
