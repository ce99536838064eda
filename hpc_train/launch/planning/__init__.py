"""The launch side's planning wing: a config read once, checked against itself and the cluster, laid out, written
as the job spec."""
