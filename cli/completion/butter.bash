# bash completion for butter: commands and subcommands from `butter help
# commands` (the command table in cli/main.c is the one source), then options from
# `butter COMMAND --help`, then file names. Installed by meson into
# share/bash-completion/completions.

_butter_words() {
	"$1" help commands 2>/dev/null
}

_butter() {
	local cur=${COMP_WORDS[COMP_CWORD]} prog=${COMP_WORDS[0]} commands line first second
	local -a words=()
	commands=$(_butter_words "$prog")
	if [ "$COMP_CWORD" -eq 1 ]; then
		while read -r line; do
			words+=("${line%% *}")
		done <<< "$commands"
		words+=(help version)
		mapfile -t COMPREPLY < <(compgen -W "$(printf '%s\n' "${words[@]}" | sort -u)" -- "$cur")
		return
	fi
	first=${COMP_WORDS[1]}
	if [ "$COMP_CWORD" -eq 2 ]; then
		while read -r line; do
			[ "${line%% *}" = "$first" ] && [ "$line" != "$first" ] && words+=("${line#* }")
		done <<< "$commands"
		if [ ${#words[@]} -gt 0 ]; then
			mapfile -t COMPREPLY < <(compgen -W "${words[*]}" -- "$cur")
			return
		fi
	fi
	if [[ $cur == -* ]]; then
		second=""
		grep -qx "$first ${COMP_WORDS[2]}" <<< "$commands" && second=${COMP_WORDS[2]}
		# shellcheck disable=SC2086
		mapfile -t COMPREPLY < <(compgen -W "$("$prog" $first $second --help 2>/dev/null |
			grep -oE -- '(^|[ ,])--?[a-zA-Z][a-zA-Z-]*' | tr -d ' ,' | sort -u)" -- "$cur")
		return
	fi
	mapfile -t COMPREPLY < <(compgen -f -- "$cur")
}
complete -o filenames -F _butter butter
