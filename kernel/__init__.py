"""What the kernel shows, read as data: the mount table (`mountinfo`), the cgroup filesystem
(`cgroupfs`), network interfaces (`netif`), errno names (`errnos`). Stdlib only, no processes."""
