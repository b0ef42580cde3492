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
# Perl from perl-base (Debian's and Ubuntu's Essential set: every image has it) with the Socket
# module only: it starts in a few ms. As PID 1 it reaps every child (SIGCHLD ignored), as sshd -D did.
use strict;
use warnings;
use Socket qw(:DEFAULT IPPROTO_TCP TCP_NODELAY IPPROTO_IPV6 IPV6_V6ONLY pack_sockaddr_in6 IN6ADDR_ANY);

my ($port, $sshd, @args) = @ARGV;
die "usage: sshd-listen.pl PORT SSHD [ARGS...]\n" unless defined $sshd && $port =~ /^\d+$/;
my $l;
if (!(socket($l, PF_INET6, SOCK_STREAM, 0) && setsockopt($l, IPPROTO_IPV6, IPV6_V6ONLY, 0)
      && setsockopt($l, SOL_SOCKET, SO_REUSEADDR, 1) && bind($l, pack_sockaddr_in6($port, IN6ADDR_ANY)))) {
  socket($l, PF_INET, SOCK_STREAM, 0) && setsockopt($l, SOL_SOCKET, SO_REUSEADDR, 1)
    && bind($l, pack_sockaddr_in($port, INADDR_ANY)) or die "sshd-listen.pl: cannot listen on port $port: $!\n";
}
listen($l, 128) or die "sshd-listen.pl: cannot listen on port $port: $!\n";
$SIG{CHLD} = 'IGNORE';
# As a container's PID 1 only signals it handles reach it: `kill 1` (the supervisor's teardown,
# a quarantine, a detached job's end) and docker stop's SIGTERM end the container, as with sshd -D.
$SIG{$_} = sub { exit 0 } for qw(TERM INT HUP);
1 while waitpid(-1, 1) > 0;  # WNOHANG: a child of the shell this replaced that ended before
while (1) {
  accept(my $conn, $l) or next;  # EINTR, or a connection reset before it was taken
  setsockopt($conn, IPPROTO_TCP, TCP_NODELAY, 1);
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
