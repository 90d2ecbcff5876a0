# tierfs-slurm.sh - what tierfs's Slurm prolog, epilog and task prolog
# share: the configuration file, the job's variables, the job's state file.
# Sourced (bash), not run.  See tierfs(8), BATCH JOBS, and slurm.conf.example.
#
# The configuration (TIERFS_SLURM_CONF, default /etc/tierfs/slurm.conf) is
# KEY=VALUE lines; blank lines and lines starting with # are ignored; the
# value is taken as it is (no quotes, no variables), with these escapes in
# paths: %j the job ID, %u the job's user, %U its uid, %g its gid, %t the
# job's TMPDIR (/tmp if unset), %% a %.  Unknown keys and bad values are
# errors, naming the file and line.

TIERFS_BINDIR=              # set by `make install` to the installed programs' directory

: "${TIERFS_SLURM_CONF:=/etc/tierfs/slurm.conf}"

# what a key is when the file does not give it
conf_defaults() {
	BACKING=/var/tmp/tierfs/%j/backing
	MOUNT=/var/tmp/tierfs/%j/mnt
	LOGFILE=/var/tmp/tierfs/%j/tierfs.log
	OPTIONS=
	PERSIST=
	DEADLINE=600
	RUN_AS=user
	KEEP_BACKING=auto
	STATE_DIR=/run/tierfs-slurm
	TIERFS=${TIERFS_BINDIR:+$TIERFS_BINDIR/}tierfs
	TIERFSCTL=${TIERFS_BINDIR:+$TIERFS_BINDIR/}tierfsctl
}

say() {
	printf '%s: %s\n' "$prog" "$*" >&2
	command -v logger >/dev/null 2>&1 && logger -t "$prog" -- "$*" 2>/dev/null
	return 0
}
die() { say "$*"; exit 1; }

# conf_load: the configuration into the variables above, or die
conf_load() {
	local n=0 line key val
	conf_defaults
	[ -e "$TIERFS_SLURM_CONF" ] ||
		die "$TIERFS_SLURM_CONF: no such file (the configuration of tierfs's Slurm" \
		    "scripts; see slurm.conf.example and tierfs(8), BATCH JOBS)"
	[ -r "$TIERFS_SLURM_CONF" ] || die "$TIERFS_SLURM_CONF: cannot be read"
	while IFS= read -r line || [ -n "$line" ]; do
		n=$((n + 1))
		line=${line%$'\r'}
		[[ $line =~ ^[[:space:]]*(#|$) ]] && continue
		[[ $line =~ ^[[:space:]]*([A-Z_]+)[[:space:]]*=(.*)$ ]] ||
			die "$TIERFS_SLURM_CONF:$n: not KEY=VALUE: $line"
		key=${BASH_REMATCH[1]} val=${BASH_REMATCH[2]}
		val=${val#"${val%%[![:space:]]*}"}
		val=${val%"${val##*[![:space:]]}"}
		case $key in
		BACKING|MOUNT|LOGFILE|PERSIST|STATE_DIR|TIERFS|TIERFSCTL)
			[ -z "$val" ] || [ "${val#/}" != "$val" ] || [ "$key" = TIERFS ] ||
				[ "$key" = TIERFSCTL ] || [ "$key" = LOGFILE ] ||
				die "$TIERFS_SLURM_CONF:$n: $key must be an absolute path, not '$val'" ;;
		OPTIONS)
			case $val in *[[:space:]]*)
				die "$TIERFS_SLURM_CONF:$n: OPTIONS is one -o list, without spaces: '$val'"
			esac ;;
		DEADLINE)
			[[ $val =~ ^[0-9]+$ ]] && [ "$val" -ge 1 ] ||
				die "$TIERFS_SLURM_CONF:$n: DEADLINE must be a number of seconds, not '$val'" ;;
		RUN_AS)
			case $val in user|root) ;; *)
				die "$TIERFS_SLURM_CONF:$n: RUN_AS must be user or root, not '$val'"
			esac ;;
		KEEP_BACKING)
			case $val in auto|yes|no) ;; *)
				die "$TIERFS_SLURM_CONF:$n: KEEP_BACKING must be auto, yes or no, not '$val'"
			esac ;;
		*)
			die "$TIERFS_SLURM_CONF:$n: unknown key $key (BACKING, MOUNT, LOGFILE," \
			    "OPTIONS, PERSIST, DEADLINE, RUN_AS, KEEP_BACKING, STATE_DIR, TIERFS," \
			    "TIERFSCTL)" ;;
		esac
		printf -v "$key" '%s' "$val"
	done < "$TIERFS_SLURM_CONF"
	for key in BACKING MOUNT STATE_DIR; do
		[ -n "${!key}" ] || die "$TIERFS_SLURM_CONF: $key may not be empty"
	done
}

# job_vars: the job's variables that Slurm sets for a prolog, checked
job_vars() {
	[[ ${SLURM_JOB_ID:-} =~ ^[0-9]+$ ]] ||
		die "SLURM_JOB_ID is '${SLURM_JOB_ID:-}', not a job ID (run by slurmd as Prolog/Epilog)"
	[[ ${SLURM_JOB_UID:-} =~ ^[0-9]+$ && ${SLURM_JOB_GID:-} =~ ^[0-9]+$ ]] ||
		die "job $SLURM_JOB_ID: SLURM_JOB_UID or SLURM_JOB_GID missing"
	[[ ${SLURM_JOB_USER:-} =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]*$ ]] ||
		die "job $SLURM_JOB_ID: SLURM_JOB_USER is '${SLURM_JOB_USER:-}'"
	[ "$SLURM_JOB_UID" -ne 0 ] || [ "$RUN_AS" = root ] ||
		die "job $SLURM_JOB_ID: a job of root: RUN_AS=user makes no sense for it"
}

# expand VAR PATTERN: VAR = the pattern with %j %u %U %g %t %% replaced
expand() {
	local s=$2 out= c
	while [ -n "$s" ]; do
		c=${s:0:1} s=${s:1}
		if [ "$c" != % ]; then out+=$c; continue; fi
		c=${s:0:1} s=${s:1}
		case $c in
		j) out+=$SLURM_JOB_ID ;;
		u) out+=$SLURM_JOB_USER ;;
		U) out+=$SLURM_JOB_UID ;;
		g) out+=$SLURM_JOB_GID ;;
		t) out+=${TMPDIR:-/tmp} ;;
		%) out+=% ;;
		*) die "$TIERFS_SLURM_CONF: unknown escape %$c in '$2' (%j %u %U %g %t %%)" ;;
		esac
	done
	printf -v "$1" '%s' "$out"
}

state_file() { printf '%s/%s' "$STATE_DIR" "$SLURM_JOB_ID"; }

# state_load: the job's state (written by the prolog) into S_*; 1 if none
state_load() {
	local f line
	f=$(state_file)
	[ -f "$f" ] || return 1
	S_MOUNT= S_BACKING= S_PERSIST= S_LOGFILE= S_DEADLINE= S_RUN_AS= S_KEEP_BACKING=
	while IFS= read -r line; do
		case $line in
		MOUNT=*|BACKING=*|PERSIST=*|LOGFILE=*|DEADLINE=*|RUN_AS=*|KEEP_BACKING=*)
			printf -v "S_${line%%=*}" '%s' "${line#*=}" ;;
		esac
	done < "$f"
	return 0
}

# as_job_user CMD...: run CMD as the job's user (with the user's groups)
as_job_user() {
	setpriv --reuid="$SLURM_JOB_UID" --regid="$SLURM_JOB_GID" --init-groups -- "$@"
}
