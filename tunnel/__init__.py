"""Public reachability for the bridge: cloudflared quick tunnels and advertised URLs."""
