"""kolo.MPI's parts (the public names are in `kolo.MPI`)."""
