"""What a run left behind, read: its timeline, a hang's stacks, the straggler rule, the report page."""
