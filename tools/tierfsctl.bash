# bash completion of tierfsctl(1); installed as
# PREFIX/share/bash-completion/completions/tierfsctl
_tierfsctl()
{
	local cur=${COMP_WORDS[COMP_CWORD]} cmd=${COMP_WORDS[1]:-}
	local cmds="order next prefetch info wait commit sets latest keep stats warmup evict record plot"

	if [ "$COMP_CWORD" -eq 1 ]; then
		COMPREPLY=($(compgen -W "$cmds --help --version" -- "$cur"))
		return
	fi
	case $cmd in
	prefetch)
		if [ "$COMP_CWORD" -eq 2 ]; then
			COMPREPLY=($(compgen -W "start stop status" -- "$cur"))
			return
		fi ;;
	stats)
		case $cur in -*)
			COMPREPLY=($(compgen -W "--watch --json --prometheus" -- "$cur"))
			return ;;
		esac ;;
	order) case $cur in -*) COMPREPLY=($(compgen -W "--clear --from" -- "$cur")); return ;; esac ;;
	wait) case $cur in -*) COMPREPLY=($(compgen -W "--timeout --level --unmount" -- "$cur")); return ;; esac
		if [ "${COMP_WORDS[COMP_CWORD-1]}" = --level ]; then
			COMPREPLY=($(compgen -W "cache ssd pfs" -- "$cur"))
			return
		fi ;;
	latest) case $cur in -*) COMPREPLY=($(compgen -W "--level" -- "$cur")); return ;; esac
		if [ "${COMP_WORDS[COMP_CWORD-1]}" = --level ]; then
			COMPREPLY=($(compgen -W "cache ssd pfs" -- "$cur"))
			return
		fi ;;
	sets) case $cur in -*) COMPREPLY=($(compgen -W "--json" -- "$cur")); return ;; esac ;;
	evict) case $cur in -*) COMPREPLY=($(compgen -W "--timeout" -- "$cur")); return ;; esac ;;
	warmup) case $cur in -*) COMPREPLY=($(compgen -W "--stall --progress --no-progress" -- "$cur")); return ;; esac ;;
	record) case $cur in -*) COMPREPLY=($(compgen -W "--interval --count" -- "$cur")); return ;; esac ;;
	esac
	COMPREPLY=($(compgen -f -- "$cur"))
}
complete -o filenames -F _tierfsctl tierfsctl
