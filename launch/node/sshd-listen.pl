#!/usr/bin/perl
# sshd-listen.pl PORT SSHD [ARGS...]: the container's ssh listener (entrypoint.sh, a node of a
# job). Accepts on PORT (IPv6 and IPv4, or IPv4 alone where the kernel has no IPv6), turns off
# Nagle's algorithm on each connection and runs `SSHD -i ARGS` on it, as inetd would.
#
# Why: sshd leaves Nagle on for sessions without a terminal (mpirun's daemons, the launch's ready
# check), and during its handshake it writes two small packets in a row (its debug lines once
# the key is accepted): the second waits for the client's delayed ACK, 40 ms on Linux. With
# TCP_NODELAY set here, on the socket sshd inherits, a key exchange from one container to
# another takes about 0.09 s instead of 0.14 s (docs/benchmarks.md, "Launch", session 12);
# with the client's side of the same stall gone too (ssh-connect.pl), 0.04 s.
#
# Perl from perl-base (Debian's and Ubuntu's Essential set: every image has it), its builtins only:
# 2 ms to start (`use Socket` alone costs 5 ms more, and this start is on every launch's path to
# a node's sshd). Linux's numbers, as in ssh-connect.pl: PF_INET6 10, PF_INET 2, SOCK_STREAM 1,
# SOL_SOCKET 1, SO_REUSEADDR 2, IPPROTO_IPV6 41, IPV6_V6ONLY 26, IPPROTO_TCP 6, TCP_NODELAY 1,
# WNOHANG 1; a sockaddr is the family in the machine's byte order, then the port in the network's.
# As PID 1 it reaps every child (SIGCHLD ignored), as sshd -D did.
my ($port, $sshd, @args) = @ARGV;
die "usage: sshd-listen.pl PORT SSHD [ARGS...]\n" unless defined $sshd && $port =~ /^\d+$/;
my $l;
if (!(socket($l, 10, 1, 0) && setsockopt($l, 41, 26, 0) && setsockopt($l, 1, 2, 1)
      && bind($l, pack('S n N a16 N', 10, $port, 0, "\0" x 16, 0)))) {
  close $l if defined $l;
  socket($l, 2, 1, 0) && setsockopt($l, 1, 2, 1) && bind($l, pack('S n a4 x8', 2, $port, "\0" x 4))
    or die "sshd-listen.pl: cannot listen on port $port: $!\n";
}
listen($l, 128) or die "sshd-listen.pl: cannot listen on port $port: $!\n";
$SIG{CHLD} = 'IGNORE';
# As a container's PID 1 only signals it handles reach it: `kill 1` (the supervisor's teardown,
# a quarantine, a detached job's end) and docker stop's SIGTERM end the container, as with sshd -D.
$SIG{$_} = sub { exit 0 } for qw(TERM INT HUP);
1 while waitpid(-1, 1) > 0;  # WNOHANG: a child of the shell this replaced that ended before
while (1) {
  accept(my $conn, $l) or next;  # EINTR, or a connection reset before it was taken
  setsockopt($conn, 6, 1, 1);  # TCP_NODELAY
  my $pid = fork;
  if (defined $pid && $pid == 0) {
    close $l;
    open(STDIN, '<&', $conn) && open(STDOUT, '>&', $conn) or exit 1;
    close $conn;
    exec $sshd, '-i', @args;
    exit 1;
  }
  close $conn;
}
