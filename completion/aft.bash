# aft.bash - bash completion for aft(1).                    -*- shell-script -*-
#
# Completes the subcommands, each subcommand's options (its option table in
# cli/; cli/tests/test_docs.c checks the lists below against it), the values
# of options that take one of a fixed set, file names, and the NAME of a
# FILE.safetensors:NAME or FILE.npz:NAME operand (read with `aft info --json`).
#
# Installed by `make install` as share/bash-completion/completions/aft, where
# bash-completion loads it on demand; or source it from ~/.bashrc. It needs
# nothing from the bash-completion package.

_aft_commands="info run grad mask compare convert model generate encode decode bench train help"

# the options of subcommand $1
_aft_options()
{
    case $1 in
    info) echo "--json --max-memory -q --quiet -h --help" ;;
    run) echo "--variant --window --heads --causal --mask --layout --weights --prefix --seed" \
              "--d-hidden -o --output --timing --repeat --threads --impl --precision --max-memory --state-in --grid" \
              "--state-out --strict" \
              "-q --quiet -h --help" ;;
    grad) echo "--variant --window --heads --causal --mask --layout --weights --prefix --seed" \
               "--d-hidden -o --output --timing --repeat --threads --impl --precision --max-memory --grid" \
               "--grad-output --dy --strict -q --quiet -h --help" ;;
    mask) echo "--len --window --causal --format --json -o -q --quiet -h --help" ;;
    compare) echo "--rtol --atol --equal-nan --json --max-memory -q --quiet -h --help" ;;
    convert) echo "-o --output --dtype --metadata --format --max-memory -q --quiet -h --help" ;;
    model) echo "--weights -o --output --layout --window --threads --impl --precision --max-memory --strict" \
                "--grad --targets --dropout --seed --timing -q --quiet -h --help" ;;
    generate) echo "--weights --prompt -n --temperature --top-k --seed --greedy --vocab --window --threads" \
                   "--precision --timing --max-memory --strict -q --quiet -h --help" ;;
    encode) echo "--weights --text-file -o --output --vocab --max-memory -q --quiet -h --help" ;;
    decode) echo "--weights --vocab --max-memory -q --quiet -h --help" ;;
    bench) echo "--seq-len --d-model --d-hidden --variant --window --heads --causal --batch" \
                "--threads --repeat --impl --precision --json --no-ceiling --plot --stream --chunk --grid --grad" \
                "--generate --weights --weights-dtype -q --quiet -h --help" ;;
    train) echo "--text --valid --init --resume --batches -o --output --state --layers --d-model --d-ff --window" \
                "--seq-len --batch --steps --lr --warmup --pos-bias-lr-mult --dropout --seed --val-every" \
                "--val-windows --save-every --log --timing --threads -q --quiet -h --help" ;;
    esac
}

# What option $2 of subcommand $1 takes: "file", "none" (a number or free
# text: nothing to offer), "list:A B C" (one of these), "csv:A B C" (a
# comma-separated list of these), or "flag" when it takes no value.
_aft_value()
{
    case $1:$2 in
    grad:--mask | grad:--weights | grad:-o | grad:--output | grad:--timing | grad:--grad-output | grad:--dy | \
    run:--mask | run:--weights | run:-o | run:--output | run:--timing | run:--state-in | run:--state-out | mask:-o | \
    convert:-o | convert:--output | bench:--plot | bench:--weights | model:--weights | model:-o | model:--output | \
    generate:--weights | generate:--vocab | generate:--timing | model:--timing | encode:--weights | \
    encode:--text-file | encode:-o | encode:--output | encode:--vocab | decode:--weights | decode:--vocab | \
    model:--targets | train:--text | train:--valid | train:--init | train:--resume | train:--batches | train:-o | \
    train:--output | train:--state | train:--log | train:--timing) echo file ;;
    run:--variant | grad:--variant) echo "list:full local simple conv" ;;
    run:--layout | grad:--layout | model:--layout) echo "list:btd tbd" ;;
    run:--impl | grad:--impl | model:--impl) echo "list:fast reference" ;;
    run:--precision | grad:--precision | model:--precision | generate:--precision) echo "list:f32 bf16" ;;
    bench:--precision) echo "csv:f32 bf16" ;;
    mask:--format) echo "list:text npy json" ;;
    convert:--format) echo "list:npy npz safetensors" ;;
    convert:--dtype) echo "list:f32 f16 bf16 f64" ;;
    bench:--impl) echo "list:fast reference both" ;;
    bench:--weights-dtype) echo "list:f32 f16 bf16" ;;
    bench:--variant) echo "csv:full local simple conv" ;;
    run:--window | run:--heads | run:--prefix | run:--seed | run:--d-hidden | run:--repeat | \
    run:--threads | run:--max-memory | mask:--len | mask:--window | compare:--rtol | \
    compare:--atol | convert:--metadata | info:--max-memory | compare:--max-memory | convert:--max-memory | bench:--seq-len | bench:--d-model | \
    bench:--d-hidden | bench:--window | bench:--heads | bench:--batch | bench:--threads | \
    bench:--repeat | bench:--chunk | bench:--grid | run:--grid | grad:--window | grad:--heads | grad:--prefix | \
    grad:--seed | grad:--d-hidden | grad:--repeat | grad:--threads | grad:--max-memory | grad:--grid | \
    model:--window | model:--threads | model:--max-memory | model:--dropout | model:--seed | generate:--prompt | generate:-n | \
    generate:--temperature | generate:--top-k | generate:--seed | generate:--window | generate:--threads | \
    generate:--max-memory | encode:--max-memory | decode:--max-memory | train:--layers | train:--d-model | \
    train:--d-ff | train:--window | train:--seq-len | train:--batch | train:--steps | train:--lr | train:--warmup | \
    train:--pos-bias-lr-mult | train:--dropout | train:--seed | train:--val-every | train:--val-windows | \
    train:--save-every | train:--threads) echo none ;;
    *) echo flag ;;
    esac
}

# file names starting with $1. -o filenames makes readline quote them and
# put '/' rather than a space after a directory (compopt works only while
# bash is really completing, hence the silenced error).
_aft_files()
{
    local IFS=$'\n'
    COMPREPLY+=($(compgen -f -- "$1"))
    compopt -o filenames 2>/dev/null
}

# "FILE.safetensors:" or "FILE.npz:" followed by each tensor name in FILE
# starting with $2 ($1 is the aft command to ask)
_aft_tensor_names()
{
    local aft=$1 cur=$2 file names n
    if [[ $cur == *.npz:* && ${cur%.npz:*} != *.safetensors:* ]]; then
        file=${cur%.npz:*}.npz
    else
        file=${cur%.safetensors:*}.safetensors
    fi
    [[ -f $file ]] || return
    # each tensor's object in `aft info --json` starts with {"name":"...";
    # names holding a '"' are written escaped and skipped here
    names=$("$aft" info --json -- "$file" 2>/dev/null | grep -o '{"name":"[^"\\]*"' | cut -d'"' -f4)
    local IFS=$'\n'
    for n in $names; do
        [[ $file:$n == "$cur"* ]] && COMPREPLY+=("$file:$n")
    done
}

_aft()
{
    COMPREPLY=()
    local cword=${COMP_CWORD:-0}
    # Bash splits words at ':' and '=' (COMP_WORDBREAKS): join the pieces of
    # the word under the cursor back, so "x.safetensors : w" is one word, and
    # remember where it started.
    local start=$cword cur=${COMP_WORDS[cword]}
    while ((start > 1)) && [[ ${COMP_WORDS[start]} == [:=] || ${COMP_WORDS[start - 1]} == [:=] ]]; do
        ((start--))
        cur=${COMP_WORDS[start]}$cur
    done
    local prev=""
    ((start > 0)) && prev=${COMP_WORDS[start - 1]}

    local aft=${COMP_WORDS[0]:-aft}
    command -v "$aft" >/dev/null 2>&1 || aft=aft

    if ((start <= 1)); then
        if [[ $cur == -* ]]; then
            COMPREPLY=($(compgen -W "--help --version --quiet" -- "$cur"))
        else
            COMPREPLY=($(compgen -W "$_aft_commands" -- "$cur"))
        fi
        return 0
    fi

    local cmd=${COMP_WORDS[1]} i operands_only=0
    for ((i = 2; i < start; i++)); do
        [[ ${COMP_WORDS[i]} == -- ]] && operands_only=1
    done
    if [[ $cmd == help ]]; then
        ((start == 2)) && COMPREPLY=($(compgen -W "${_aft_commands% help}" -- "$cur"))
        return 0
    fi

    # the value of an option: "--opt value", or "--opt=value" (one word)
    local opt="" val=$cur
    if ((!operands_only)); then
        if [[ $cur == -*=* ]]; then
            opt=${cur%%=*}
            val=${cur#*=}
        elif [[ $prev == -* ]]; then
            opt=$prev
        fi
    fi
    local kind=flag
    [[ -n $opt ]] && kind=$(_aft_value "$cmd" "$opt")

    local -a full=()
    if [[ $kind != flag ]]; then
        case $kind in
        file) _aft_files "$val" ;;
        list:*) COMPREPLY=($(compgen -W "${kind#list:}" -- "$val")) ;;
        csv:*)
            # complete the item after the last comma, keeping the ones before
            local done_items=""
            [[ $val == *,* ]] && done_items=${val%,*},
            COMPREPLY=($(compgen -P "$done_items" -W "${kind#csv:}" -- "${val##*,}"))
            ;;
        esac
        # put a "--opt=" prefix back; it is stripped below with the rest
        if [[ $cur == -*=* ]]; then
            for i in "${!COMPREPLY[@]}"; do COMPREPLY[i]=$opt=${COMPREPLY[i]}; done
        fi
    elif [[ $cur == -* ]] && ((!operands_only)); then
        COMPREPLY=($(compgen -W "$(_aft_options "$cmd")" -- "$cur"))
    else
        case $cmd in
        info | run | grad | model | decode) _aft_files "$cur" ;;
        compare | convert)
            # NAME=INPUT (convert): complete INPUT after the first '='
            local name=""
            if [[ $cmd == convert && $cur == [!=]*=* && ! -e $cur ]]; then
                name=${cur%%=*}=
            fi
            local src=${cur#"$name"}
            if [[ $src == *.safetensors:* || $src == *.npz:* ]]; then
                _aft_tensor_names "$aft" "$src"
            else
                _aft_files "$src"
                # one .safetensors or .npz: no space yet, a ':NAME' may follow
                [[ ${#COMPREPLY[@]} == 1 && ( ${COMPREPLY[0]} == *.safetensors || ${COMPREPLY[0]} == *.npz ) ]] &&
                    compopt -o nospace 2>/dev/null
            fi
            for i in "${!COMPREPLY[@]}"; do COMPREPLY[i]=$name${COMPREPLY[i]}; done
            ;;
        esac
    fi

    # Readline replaces only the text after the last ':' or '=' that is a
    # word break: drop that much of cur from every reply.
    local lead=""
    for ((i = ${#cur} - 1; i >= 0; i--)); do
        local c=${cur:i:1}
        if [[ ( $c == : || $c == = ) && $COMP_WORDBREAKS == *"$c"* ]]; then
            lead=${cur:0:i+1}
            break
        fi
    done
    if [[ -n $lead ]]; then
        for i in "${!COMPREPLY[@]}"; do COMPREPLY[i]=${COMPREPLY[i]#"$lead"}; done
    fi
    return 0
}

complete -F _aft aft
