"""``embodied sweep``: grids and seeds of training runs, on this machine or a Ray cluster.

``spec`` reads the sweep file into jobs, ``engines`` runs them (a local pool of pinned processes
or Ray tasks), ``report`` turns the finished runs into one table, one JSON file and one plot.
"""
