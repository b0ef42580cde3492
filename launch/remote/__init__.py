"""The nodes as the launcher reaches them: `hosts` (hostfile, --hosts, --ec2-tag -> [Node], the
-H format), `transport` (ssh: options, fast key exchange, master connections), `fanout` (one
command on many nodes at once, retries). jobs/, infra/ and troubleshoot/ import from here;
nothing here imports them."""
