"""What every running service uses: its event log, its Prometheus registry, once-only logging of repeating failures, and one background job at a time."""
