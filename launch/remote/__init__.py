"""The nodes as the launcher reaches them: `hosts` (hostfile, --hosts -> [Node], the -H format;
where nodes come from is launch/targets/), `transport` (ssh: options, fast key exchange, master connections), `fanout` (one
command on many nodes at once, retries). jobs/, infra/, targets/ and troubleshoot/ import from here;
nothing here imports them."""
