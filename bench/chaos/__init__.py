"""The relay under hardbyte/postgresql-job-queue-benchmarking's chaos harness (README.md here).

``harness`` registers the system ``outbox`` with the harness and runs it (on the harness's Python
3.12); the harness starts ``adapter`` once per replica, and ``harness`` the run's receiver,
``arrivals`` (both on this project's Python); ``report`` turns a run's results into the per-phase
table, lost messages and duplicates included.
"""
