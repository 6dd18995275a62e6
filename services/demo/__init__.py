"""The main job: the five services, a simulated cluster, a live view, a summary and a report."""
