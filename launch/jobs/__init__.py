"""Running jobs: command builders, the job's stages, its supervisor's plan, job records."""
