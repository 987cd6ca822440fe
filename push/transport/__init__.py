"""The push's data plane: broadcast groups with rank 0 = the learner (`broadcast`), kept across pushes
(`groups`), the join handshake in front of every broadcast (`rendezvous`), and the bucket layout the weights
travel in (`buckets`, `flat`, `staging`)."""
