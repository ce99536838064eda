"""Containers: the ranks run inside the site's image (Apptainer, pyxis/enroot, Slurm's OCI support).

Login side and batch host (no torch): ``settings`` reads the ``container`` section, ``registry`` picks the runtime
that renders a job step's command (``apptainer``, ``pyxis``, ``oci``), ``library`` stages hpc_train for an image
that does not have it, ``checks`` refuses bad input before anything is queued. Rank side, first thing inside the
image: ``inside`` checks the image and records what ran.
"""
