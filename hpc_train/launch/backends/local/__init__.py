"""The local backend (``launcher=local``): a job's ranks as processes of this machine, replica groups as jobs
of their own, and a rank of a world ``torchrun`` started."""
