#!/usr/bin/perl
# ssh-connect.pl HOST PORT SECONDS SSH_ARGV...: connects to HOST:PORT (IPv4) with Nagle's
# algorithm off and runs SSH_ARGV, an ssh given `-o ProxyCommand=-`, on that connection (its
# stdin and stdout). The launch's ready check (run.sh --connect) makes each master connection
# from the first container to the others this way.
#
# Why: ssh turns Nagle off only for sessions with a terminal, and in its handshake it writes two
# small packets in a row (NEWKEYS, then its service request): the second waits for the server's
# delayed ACK, 40 ms on Linux. With sshd-listen.pl on the other side (the server's own stall), a
# key exchange from one container to another took 0.04 s this way against 0.08 s
# (docs/benchmarks.md, "Launch", session 13).
#
# Perl's builtins only, no module (2 ms to start; `use Socket` alone costs 5 ms more): Linux's
# numbers for AF_INET (2), SOCK_STREAM (1), IPPROTO_TCP (6) and TCP_NODELAY (1). Fails as ssh
# does, a line on stderr and exit 255, where HOST does not resolve, PORT refuses, or nothing
# answers within SECONDS.
my ($host, $port, $secs, @ssh) = @ARGV;
die "usage: ssh-connect.pl HOST PORT SECONDS SSH_ARGV...\n"
  unless @ssh && $port =~ /^\d+$/ && $secs =~ /^\d+$/;
sub fail { print STDERR "ssh: $_[0]\n"; exit 255 }
my $addr = gethostbyname($host);
fail("Could not resolve hostname $host") unless defined $addr && length($addr) == 4;
socket(my $s, 2, 1, 6) or fail("socket: $!");
setsockopt($s, 6, 1, 1) or fail("setsockopt TCP_NODELAY: $!");
$SIG{ALRM} = sub { fail("connect to host $host port $port: Connection timed out") };
alarm $secs;
connect($s, pack('S n a4 x8', 2, $port, $addr)) or fail("connect to host $host port $port: $!");
alarm 0;
open(STDIN, '<&', $s) && open(STDOUT, '>&', $s) or fail("dup: $!");
close $s;
exec { $ssh[0] } @ssh;
fail("cannot run $ssh[0]: $!");
