#!/usr/bin/perl
# docker-api.pl: the node's short docker calls on every launch, asked of the engine's API
# directly (launch/node/host/: image.sh inspect_image; holds.sh engine, for start.sh, probe.sh
# and remove.sh).
#   image REF LABEL...   `docker image inspect`: prints `ID VALUE... DIGESTS` on one line, as the
#                        CLI's template there would: the image's ID, each LABEL's value in
#                        Config.Labels (`-` where unset or empty), its RepoDigests as a JSON
#                        array; nothing (exit 0) where the engine has no such image
#   run -d --name NAME FLAGS... IMAGE [COMMAND...]
#                        `docker run -d`, for the flags a launch gives (launch/jobs/container.py
#                        docker_run_parts, host/start.sh node_flags but --gpus and --device): the
#                        container created and started, its ID printed; where the start fails, the
#                        engine's message on stderr and the CLI's code (127 a command not found,
#                        126 one not executable, else 125; the container stays, as the CLI's)
#   rm -f NAME           `docker rm -f`: exit 0 once removed or where there is no such container
#                        (as the CLI since Docker 23)
# Exits 3 wherever the CLI must answer instead, before anything is made: DOCKER_HOST other than
# a unix socket, DOCKER_CONTEXT or a CLI context in use, proxies in the CLI's config (the CLI puts
# them in a container's environment), DOCKER_DEFAULT_PLATFORM, DOCKER_API_VERSION or
# DOCKER_CONTENT_TRUST set, no socket, a flag or value outside what is said here, an engine that
# refuses the create (the CLI's own call then says it in its words). Once the engine made the
# container, a failure is said here (exit 125), never left to the CLI, which would make another
# (a create whose answer was lost on the way is the one exception: the CLI's create then finds
# the name taken, which host/start.sh answers by removing that container, once).
#
# Why: the docker CLI costs 18-21 ms of CPU for an image's inspect and more for a run (a Go
# program's start, its config and version negotiation), this 2-3 ms (perl's start and a request
# over the socket), dockerd's side included (docs/benchmarks.md, "Issue 52: the warm launch's CPU").
#
# Perl's builtins only (perl-base; `use Socket` alone costs 5 ms): Linux's AF_UNIX (1) and
# SOCK_STREAM (1); a sockaddr_un is the family, then the path in 108 bytes. HTTP/1.0: the engine
# answers without chunks and closes the connection.
use strict;
my ($what, @args) = @ARGV;
exit 2 unless defined $what;

my $sock = '/var/run/docker.sock';
if (defined $ENV{DOCKER_HOST} && $ENV{DOCKER_HOST} ne '') {
  exit 3 unless $ENV{DOCKER_HOST} =~ m{\Aunix://(/.+)\z};
  $sock = $1;
}
for (qw(DOCKER_CONTEXT DOCKER_DEFAULT_PLATFORM DOCKER_API_VERSION DOCKER_CONTENT_TRUST)) {
  exit 3 if defined $ENV{$_} && $ENV{$_} ne '';
}
# a context chosen in the CLI's config (`docker context use`) points the CLI elsewhere; its
# proxies go into every container the CLI makes
my $conf = ($ENV{DOCKER_CONFIG} // (($ENV{HOME} // '') . '/.docker')) . '/config.json';
if (open(my $c, '<', $conf)) {
  local $/;
  my $text = <$c> // '';
  exit 3 if $text =~ /"currentContext"\s*:\s*"(?!default")/ || $text =~ /"proxies"\s*:/;
}
exit 3 unless length($sock) < 108;

# Once the engine made a container, a failure is this program's to say (fail), not the CLI's.
my $made;
sub fail {
  exit 3 unless defined $made;
  print STDERR "docker: error starting container $made: $_[0]\n";
  exit 125;
}
$SIG{ALRM} = sub { fail('the engine did not answer within 120 s') };
alarm 120;

# request METHOD PATH [BODY]: (status, body) of the engine's answer; where there is none, fail.
sub request {
  my ($method, $path, $body) = @_;
  my $s;
  socket($s, 1, 1, 0) && connect($s, pack('S a108', 1, $sock)) or fail("cannot connect to $sock: $!");
  my $req = "$method $path HTTP/1.0\r\nHost: docker\r\nConnection: close\r\n";
  $req .= defined $body ? "Content-Type: application/json\r\nContent-Length: " . length($body) . "\r\n\r\n$body" : "\r\n";
  while (length $req) {
    my $n = syswrite($s, $req);
    fail("cannot write to $sock: $!") unless $n;
    substr($req, 0, $n) = '';
  }
  my $resp = '';
  while (1) {
    my $n = sysread($s, my $buf, 65536);
    fail("cannot read from $sock: $!") unless defined $n;
    last if $n == 0;
    $resp .= $buf;
  }
  my ($status) = $resp =~ m{\AHTTP/1\.[01] (\d{3})};
  my $at = index($resp, "\r\n\r\n");
  fail('the engine\'s answer is not HTTP') unless defined $status && $at >= 0;
  return ($status, substr($resp, $at + 4));
}

# A JSON value of $_[0] at its pos: [kind, value]: kind s (a string, its escapes undone), u (a
# string holding a \u escape: kept as written; no value dtrain reads holds one), o (an object: a
# hash of values), a (an array of values), v (a number, true, false, null: its text).
my %unescape = ('"' => '"', '\\' => '\\', '/' => '/', b => "\b", f => "\f", n => "\n", r => "\r", t => "\t");
sub value {
  for ($_[0]) {
    /\G\s*/gc;
    if (/\G\{/gc) {
      my %h;
      /\G\s*/gc;
      return ['o', \%h] if /\G\}/gc;
      while (1) {
        my $k = value($_);
        die unless $k->[0] eq 's';
        /\G\s*:/gc or die;
        $h{$k->[1]} = value($_);
        /\G\s*/gc;
        next if /\G,/gc;
        /\G\}/gc or die;
        return ['o', \%h];
      }
    }
    if (/\G\[/gc) {
      my @a;
      /\G\s*/gc;
      return ['a', \@a] if /\G\]/gc;
      while (1) {
        push @a, value($_);
        /\G\s*/gc;
        next if /\G,/gc;
        /\G\]/gc or die;
        return ['a', \@a];
      }
    }
    if (/\G"((?:[^"\\]++|\\.)*+)"/gcs) {
      my $t = $1;
      return ['u', $t] if $t =~ /\\u/;
      $t =~ s/\\(["\\\/bfnrt])/$unescape{$1}/g;
      return ['s', $t];
    }
    return ['v', $1] if /\G(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|true|false|null)/gc;
    die;
  }
}

sub parse { my $text = shift; my $v = eval { value($text) }; return $v }

# json VALUE: a string as JSON (its bytes kept: the engine reads UTF-8, as the CLI sends it)
sub json {
  my $t = shift;
  $t =~ s/(["\\])/\\$1/g;
  $t =~ s/([\x00-\x1f\x7f])/sprintf('\\u%04x', ord $1)/ge;
  return "\"$t\"";
}

my $REF = qr{\A[A-Za-z0-9][A-Za-z0-9._/:@-]*\z};
my $NAME = qr{\A[A-Za-z0-9][A-Za-z0-9_.-]*\z};

if ($what eq 'image') {
  my ($ref, @labels) = @args;
  exit 3 unless defined $ref && $ref =~ $REF && $ref !~ /\.\./ && length($ref) < 512;
  for (@labels) { exit 3 unless m{\A[A-Za-z0-9._/-]+\z} }
  my ($status, $body) = request('GET', "/images/$ref/json");
  exit 0 if $status eq '404';
  exit 3 unless $status eq '200';
  my $img = parse($body);
  exit 3 unless $img && $img->[0] eq 'o';
  my $id = $img->[1]{Id};
  exit 3 unless $id && $id->[0] eq 's' && $id->[1] =~ /\Asha256:[0-9a-f]{64}\z/;
  my $cfg = $img->[1]{Config};
  my $lab = $cfg && $cfg->[0] eq 'o' ? $cfg->[1]{Labels} : undef;
  my @out = ($id->[1]);
  for my $l (@labels) {
    my $v = $lab && $lab->[0] eq 'o' ? $lab->[1]{$l} : undef;
    # the CLI's `or (index . L) "-"`: `-` where unset or empty; a value with a space or a newline
    # would break the line apart: the CLI's answer then, as before
    if ($v && $v->[0] eq 's' && $v->[1] ne '') {
      exit 3 if $v->[1] =~ /\s/;
      push @out, $v->[1];
    } else {
      exit 3 if $v && $v->[0] ne 's' && $v->[0] ne 'v';
      push @out, '-';
    }
  }
  my $dig = $img->[1]{RepoDigests};
  if (!$dig || ($dig->[0] eq 'v' && $dig->[1] eq 'null')) {
    push @out, 'null';
  } elsif ($dig->[0] eq 'a') {
    exit 3 if grep { $_->[0] ne 's' || $_->[1] !~ $REF } @{$dig->[1]};
    push @out, '[' . join(',', map { "\"$_->[1]\"" } @{$dig->[1]}) . ']';
  } else {
    exit 3;
  }
  print join(' ', @out), "\n";
  exit 0;
}

if ($what eq 'rm') {
  exit 3 unless @args == 2 && $args[0] eq '-f' && $args[1] =~ $NAME;
  my ($status) = request('DELETE', "/containers/$args[1]?force=1");
  exit 0 if $status eq '204' || $status eq '404';
  exit 3;
}

exit 3 unless $what eq 'run';
# docker run's flags, each as the CLI turns it into the create request's fields
my ($detach, $name, @env, @labels, %caps, @tmpfs, @ulimits, @mounts, %host);
while (@args && $args[0] =~ /\A-/) {
  my $f = shift @args;
  if ($f eq '-d') { $detach = 1; next }
  exit 3 unless @args;
  my $v = shift @args;
  if ($f eq '--name') { exit 3 unless $v =~ $NAME; $name = $v }
  elsif ($f eq '--network') { exit 3 unless $v eq 'host'; $host{NetworkMode} = json('host') }
  elsif ($f eq '--ipc') { exit 3 unless $v eq 'host'; $host{IpcMode} = json('host') }
  elsif ($f eq '--shm-size') {
    # units.RAMInBytes: a unit of 1024s
    my ($n, $u) = $v =~ /\A(\d+)([bkmgBKMG]?)\z/ or exit 3;
    $host{ShmSize} = $n * 1024 ** index('bkmg', lc($u || 'b'));
  }
  elsif ($f eq '--tmpfs') { exit 3 unless $v =~ m{\A/[^:,]*\z}; push @tmpfs, json($v) . ':""' }
  elsif ($f eq '--cap-add') {  # as the CLI sends them: CAP_ before each, but ALL; sorted, once
    exit 3 unless $v =~ /\A[A-Z_]+\z/;
    $caps{$v eq 'ALL' || $v =~ /\ACAP_/ ? $v : "CAP_$v"} = 1;
  }
  elsif ($f eq '--ulimit') {
    my ($k, $soft, $hard) = $v =~ /\A([a-z]+)=(-?\d+)(?::(-?\d+))?\z/ or exit 3;
    push @ulimits, '{"Name":' . json($k) . ',"Soft":' . $soft . ',"Hard":' . ($hard // $soft) . '}';
  }
  elsif ($f eq '--mount') {
    # type=bind,src=S,dst=D[,readonly]: the CLI reads it as CSV; no quote or comma in a value here
    exit 3 if $v =~ /"/;
    my ($type, $src, $dst, $ro) = ('', undef, undef, 'false');
    for (split /,/, $v) {
      my ($k, $x) = /\A([a-z-]+)(?:=(.*))?\z/s or exit 3;
      if ($k eq 'type') { $type = $x // '' }
      elsif ($k eq 'src' || $k eq 'source') { $src = $x }
      elsif ($k eq 'dst' || $k eq 'destination' || $k eq 'target') { $dst = $x }
      elsif (($k eq 'readonly' || $k eq 'ro') && (!defined $x || $x =~ /\A(1|true)\z/)) { $ro = 'true' }
      else { exit 3 }
    }
    exit 3 unless $type eq 'bind' && defined $src && defined $dst && $src =~ m{\A/} && $dst =~ m{\A/};
    push @mounts, '{"Type":"bind","Source":' . json($src) . ',"Target":' . json($dst) . ',"ReadOnly":' . $ro . '}';
  }
  elsif ($f eq '--label') { my ($k, $x) = split /=/, $v, 2; push @labels, json($k) . ':' . json($x // '') }
  elsif ($f eq '-e') { exit 3 unless $v =~ /\A[^=]+=/; push @env, json($v) }
  else { exit 3 }  # --gpus, --device and anything else: the CLI's own reading of it
}
exit 3 unless $detach && defined $name && @args && $args[0] =~ $REF;
my ($image, @cmd) = @args;
$host{Tmpfs} = '{' . join(',', @tmpfs) . '}' if @tmpfs;
$host{CapAdd} = '[' . join(',', map { json($_) } $caps{ALL} ? ('ALL') : sort keys %caps) . ']' if %caps;
$host{Ulimits} = '[' . join(',', @ulimits) . ']' if @ulimits;
$host{Mounts} = '[' . join(',', @mounts) . ']' if @mounts;
# what the CLI sends besides (each container as the CLI would have made it: tests/test_node_docker.py)
$host{RestartPolicy} = '{"Name":"no"}';
$host{$_} = '[]' for qw(BlkioDeviceReadBps BlkioDeviceReadIOps BlkioDeviceWriteBps BlkioDeviceWriteIOps
                        BlkioWeightDevice Devices Dns DnsOptions DnsSearch);
$host{PortBindings} = '{}';
my $body = '{"Image":' . json($image)
  . (@cmd ? ',"Cmd":[' . join(',', map { json($_) } @cmd) . ']' : '')
  . ',"Env":[' . join(',', @env) . ']'
  . ',"Labels":{' . join(',', @labels) . '}'
  . ',"AttachStdin":false,"AttachStdout":false,"AttachStderr":false,"Tty":false,"OpenStdin":false,"StdinOnce":false'
  . ',"HostConfig":{' . join(',', map { json($_) . ':' . $host{$_} } sort keys %host) . '}'
  . ($host{NetworkMode} ? ',"NetworkingConfig":{"EndpointsConfig":{"host":{}}}' : '')  # host: the only one read
  . '}';
my ($status, $resp) = request('POST', "/containers/create?name=$name", $body);
exit 3 unless $status eq '201';  # no such image, the name taken, anything else: the CLI says it
$made = $name;
my $answer = parse($resp);
my $id = $answer && $answer->[0] eq 'o' ? $answer->[1]{Id} : undef;
fail('the engine\'s answer holds no container ID') unless $id && $id->[0] eq 's' && $id->[1] =~ /\A[0-9a-f]{64}\z/;
$made = $id->[1];
($status, $resp) = request('POST', "/containers/$made/start");
if ($status ne '204' && $status ne '304') {
  # the CLI's line and exit code (docker/cli cmd/docker: 127 not found, 126 not executable)
  my $err = parse($resp);
  my $msg = $err && $err->[0] eq 'o' && $err->[1]{message} && $err->[1]{message}[0] =~ /\A[su]\z/
    ? $err->[1]{message}[1] : "status $status";
  $msg =~ s/\.\z//;
  print STDERR "docker: Error response from daemon: $msg.\n";
  exit 127 if $msg =~ /executable file not found|no such file or directory/;
  exit 126 if $msg =~ /permission denied|is a directory/;
  exit 125;
}
print "$made\n";
