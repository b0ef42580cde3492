"""Every `dtrain` task, declared beside its body, one module per area (tasks.py names them for Invoke)."""
